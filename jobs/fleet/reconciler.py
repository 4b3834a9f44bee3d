"""The sweeps over instances the database holds live: a silent one put to the cloud
(gone: preempted; there: lost), a gang's failure put to the cloud before the code is
blamed, launches lost with a message, provisioning that never registered."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from respawn.protocol import Action
from respawn_server.jobs.core.choices import EndReason, InstanceState, InterruptionKind, JobStatus
from respawn_server.jobs.core.services import nudge_schedule, request_action, steps_since_checkpoint
from respawn_server.jobs.core.transitions import end_instance, log_job_event
from respawn_server.jobs.fleet.instances import enqueue_launches
from respawn_server.jobs.fleet.providers.base import CloudState
from respawn_server.jobs.fleet.registry import provider_for
from respawn_server.jobs.models import Instance, InterruptionEvent, Job
from respawn_server.jobs.recovery.after_end import after_instance_ended, give_up_registering, judge_failure
from respawn_server.jobs.recovery.gangs import current_world_size, training_nodes

log = logging.getLogger(__name__)


def confirm_silent(instance: Instance) -> None:
    """The heartbeat deadline passed: ask the cloud before replacing the VM. Gone
    means preempted, and so does stopped (an eviction that keeps the VM, e.g. Azure's
    Deallocate: `release_stopped_disks` deletes it); still there means lost, and it is
    terminated first (fencing).

    Not before a notice's deadline: a VM saving its notice checkpoint may heartbeat late
    (a busy or slow VM), and terminating it would kill the very save the spare waits for;
    the cloud reclaims it at the deadline anyway, and then it is asked again."""
    notice_deadline = _pending_notice_deadline(instance)
    if notice_deadline is not None:
        Instance.objects.filter(pk=instance.pk, heartbeat_deadline__lt=notice_deadline).update(
            heartbeat_deadline=notice_deadline)
        log.info("instance %s of job %s is silent within its notice window: asked again at its deadline %s",
                 instance.pk, instance.job_id, notice_deadline.isoformat())
        return
    if not instance.provider_instance_id:  # never heard of a VM: nothing to ask or fence
        mark_lost(instance)
        return
    cloud = provider_for(instance.provider, instance.region)
    state = cloud.describe(instance.provider_instance_id).state
    if state in (CloudState.GONE, CloudState.STOPPED):
        _end_gone(instance, f"heartbeat deadline passed; the cloud says {state}", deleted=state == CloudState.GONE)
    else:
        cloud.terminate(instance.provider_instance_id)
        mark_lost(instance)
    nudge_schedule()


# The longest window a cloud gives a spot VM between its notice and the reclaim (AWS's
# two minutes): the deadline a VM reports is its word, so a silent VM is spared no longer.
LONGEST_NOTICE = timedelta(minutes=2)


def _pending_notice_deadline(instance: Instance):
    """The deadline of a preemption notice of the instance that has not yet passed, if
    any, at most LONGEST_NOTICE after the notice reached the control plane."""
    if instance.state != InstanceState.PREEMPTING:
        return None
    now = timezone.now()
    bounds = [min(deadline, received + LONGEST_NOTICE) for deadline, received in instance.interruptions.filter(
        kind=InterruptionKind.NOTICE, deadline__gt=now).values_list("deadline", "received_at")]
    return max((b for b in bounds if b > now), default=None)


@transaction.atomic
def mark_lost(instance: Instance) -> bool:
    """The heartbeat deadline passed: end the instance `lost` and say why."""
    if not end_instance(instance, EndReason.LOST, message="heartbeat deadline passed"):
        return False
    InterruptionEvent.objects.create(
        instance=instance,
        kind=InterruptionKind.LOST,
        source="heartbeat_timeout",
        deadline=instance.heartbeat_deadline,
        checkpoint_saved=False,
        steps_lost=steps_since_checkpoint(instance),
    )
    log.info("instance %s of job %s marked lost: no heartbeat since %s", instance.pk, instance.job_id,
             instance.last_heartbeat_at)
    after_instance_ended(instance.job_id, EndReason.LOST, instance_id=instance.pk)
    return True


def _end_gone(instance: Instance, message: str, *, deleted: bool = True) -> None:
    """End an instance the cloud evicted; `deleted`: its VM is gone, so a disk it kept
    (a stopped disk) bills no more either."""
    with transaction.atomic():
        if end_instance(instance, EndReason.PREEMPTED, message=message):
            Instance.objects.filter(pk=instance.pk).update(preemption_confirmed=True)  # the cloud's own word
            if deleted:
                Instance.objects.filter(pk=instance.pk).exclude(stopped_disk_sku="").update(
                    storage_released_at=F("ended_at"))
            InterruptionEvent.objects.create(instance=instance, kind=InterruptionKind.PREEMPTED,
                                             source="provider_api", checkpoint_saved=False,
                                             steps_lost=steps_since_checkpoint(instance))
            went_on = after_instance_ended(instance.job_id, EndReason.PREEMPTED, instance_id=instance.pk)
            if not went_on and instance.standby_for_id is None and not instance.interruptions.filter(
                    kind=InterruptionKind.NOTICE).exists():
                # Gone without a notice: no collective save can succeed without it, so the
                # rest of its gang stops at once (from their newest committed checkpoint).
                request_action(instance.job_id, Action.STOP)


def check_gang_failure(job_id: int, signature: str, output_tail: str, instance_id: int | None = None) -> None:
    """A rank of a gang failed while its peers still counted as live. A peer whose VM
    the cloud says is gone was preempted, and the failure followed from it; else the
    failure is the code's. Either way the job moves on only from where it was (an
    interruption found meanwhile has already moved it), and a judgement that arrives
    after the gang was already replaced is dropped: it is about an older generation."""
    failed = Instance.objects.filter(pk=instance_id).first() if instance_id is not None else None

    def replaced() -> bool:
        return bool(failed) and Instance.objects.filter(job_id=job_id, rank=failed.rank, pk__gt=failed.pk).exists()

    if replaced():
        return
    for peer in Instance.objects.filter(job_id=job_id, state__in=InstanceState.LIVE).exclude(provider_instance_id=""):
        if provider_for(peer.provider, peer.region).describe(peer.provider_instance_id).state == CloudState.GONE:
            _end_gone(peer, "another rank of its gang failed; the cloud says this VM is gone")
            nudge_schedule()
            return
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        # Asked again under the job's lock: the peer's loss may have been found meanwhile,
        # and the job recovered and placed again (provisioning, as if never interrupted).
        if job.status in (JobStatus.RUNNING, JobStatus.PROVISIONING) and not replaced():
            judge_failure(job, signature, output_tail)


def check_elastic_gang(job_id: int) -> None:
    """A node of an elastic gang said its trainer exited (recovery.elastic.trainer_exited). Peers
    whose VM the cloud says is gone (or stopped) were preempted: each ends so, and the
    gang goes on without them (recovery.elastic.go_on_with_survivors). With none gone the exit
    was the code's: the gang is told to stop, and its nodes' exit reports (the failed
    one's code and output) are judged as any gang's; the job's events say so when the
    gang had shrunk and its trainers failed before a step in the new shape."""
    nodes = training_nodes(job_id).select_related("resume_checkpoint")
    if not nodes.filter(trainer_exited_at__isnull=False).exists():
        return  # regrouped meanwhile
    gone = False
    for peer in nodes.exclude(provider_instance_id=""):
        state = provider_for(peer.provider, peer.region).describe(peer.provider_instance_id).state
        if state in (CloudState.GONE, CloudState.STOPPED):
            _end_gone(peer, f"a node of its elastic gang lost its trainer; the cloud says this VM is {state}",
                      deleted=state == CloudState.GONE)
            gone = True
    if gone:
        nudge_schedule()
        return
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.status in (JobStatus.RUNNING, JobStatus.PROVISIONING):
            size = current_world_size(job)
            if size < job.nodes and not any(
                    node.last_step > (node.resume_checkpoint.step if node.resume_checkpoint else 0) for node in nodes):
                log_job_event(job_id, f"the gang's trainers failed before a step at its regrouped size of {size} "
                                      f"nodes: a trainer that cannot resume on {size} (a global batch not divisible by {size}, "
                                      f"say) needs a nodes_min it can; judged as the code's failure, and a "
                                      f"restart relaunches all {job.nodes} nodes")
            request_action(job_id, Action.STOP)


def resend_lost_launches() -> int:
    """A launch message lost with a killed worker or a restarted broker is sent again:
    `requested` instances with no VM id after a short age. Launch is idempotent (the
    provider looks the VM up by our tag first), so a slow first attempt does no harm."""
    cutoff = timezone.now() - timedelta(seconds=settings.RESPAWN["LAUNCH_RESEND_S"])
    stale = Instance.objects.filter(state=InstanceState.REQUESTED, provider_instance_id="", requested_at__lt=cutoff)
    ids = list(stale.values_list("pk", flat=True)[: settings.RESPAWN["RECONCILE_BATCH"]])
    transaction.on_commit(lambda: enqueue_launches(ids))
    return len(ids)


def retry_stuck_provisioning() -> int:
    """Instances that never registered within the provisioning timeout are fenced
    and their job re-placed. One whose agent did reach us, but whose registers the
    server failed to answer until it gave up, says nothing about capacity: its job
    fails with cause `setup`, as it would have at the next failure."""
    cutoff = timezone.now() - timedelta(seconds=settings.RESPAWN["PROVISION_TIMEOUT_S"])
    stuck = Instance.objects.filter(state__in=(InstanceState.REQUESTED, InstanceState.BOOTING), requested_at__lt=cutoff)
    count = 0
    for instance in stuck[: settings.RESPAWN["RECONCILE_BATCH"]]:
        if instance.provider_instance_id:
            provider_for(instance.provider, instance.region).terminate(instance.provider_instance_id)
        with transaction.atomic():
            if instance.register_failures:
                give_up_registering(instance, f"never registered: the control plane failed to answer its "
                                              f"{instance.register_failures} register(s) until its agent gave up")
            elif end_instance(instance, EndReason.CAPACITY_ERROR, message="never registered: provisioning timed out"):
                after_instance_ended(instance.job_id, EndReason.CAPACITY_ERROR, instance_id=instance.pk)
                count += 1
    if count:
        nudge_schedule()
    return count
