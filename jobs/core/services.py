"""Domain operations: what happens to jobs and instances when something is
reported or decided. Views and tasks call these; they never touch status fields
themselves (that is `respawn_server.jobs.core.transitions`)."""

from __future__ import annotations

import logging
import random
import socket
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, Sum
from django.db.models.functions import Greatest
from django.utils import timezone

from respawn.protocol import Action, CheckpointKind, ExitReason, PrepareOutcome, Purpose, ValidationResult
from respawn_server.jobs.core import nudges, secret_env
from respawn_server.jobs.core.audit import audit_job_cancelled, audit_job_submitted
from respawn_server.jobs.core.choices import EndReason, FailureCause, InstanceState, InterruptionKind, JobStatus
from respawn_server.jobs.core.signals import checkpoint_invalid
from respawn_server.jobs.core.transitions import end_instance, lock_job_endings, log_job_event, transition_instance, transition_job
from respawn_server.jobs.core.drilled import caused_by_drill
from respawn_server.jobs.models import Checkpoint, Instance, InterruptionEvent, Job, WorldSize, failure_message

log = logging.getLogger(__name__)

GANG_PORT = 29500  # torch.distributed's customary rendezvous port on rank 0's host


def heartbeat_timeout() -> timedelta:
    return timedelta(seconds=settings.RESPAWN["HEARTBEAT_TIMEOUT_S"])


def checkpoint_interval_s(instance: Instance) -> float:
    """The interval the agent is told (stored, so the heartbeat stays cheap)."""
    if instance.checkpoint_interval:
        return instance.checkpoint_interval["seconds"]
    return instance.job.checkpoint_interval_s or settings.RESPAWN["DEFAULT_CHECKPOINT_INTERVAL_S"]


def heartbeat_action(instance: Instance) -> str:
    if instance.state == InstanceState.ENDED:
        return Action.STOP  # fenced or ended: its replacement owns the slot now
    if instance.job.status in (JobStatus.CANCELLING, JobStatus.CANCELLED):
        return Action.STOP
    return instance.requested_action or Action.CONTINUE


def usable_checkpoint(job: Job) -> Checkpoint | None:
    """The newest committed checkpoint not known to be invalid (pending counts)."""
    return job.checkpoints.exclude(validation=ValidationResult.INVALID).order_by("-step", "-committed_at").first()


def nudge_schedule() -> None:
    """Ask a worker to schedule now (after commit); beat's periodic run is the safety net."""
    nudges.send_on_commit(nudges.SCHEDULE)


def enqueue_terminate(instance_id: int) -> None:
    nudges.send_on_commit(nudges.TERMINATE_INSTANCE, instance_id)


@transaction.atomic
def create_job(**fields) -> Job:
    """Every door that submits (API, dashboard, demo) comes here: the job, its first
    event and its audit row commit together."""
    job = Job.objects.create(**{**fields, "secret_env": secret_env.seal(fields.get("secret_env") or {})})
    log_job_event(job.pk, f"submitted by {job.owner}")
    audit_job_submitted(job.owner, job)
    nudge_schedule()
    return job


@transaction.atomic
def cancel_job(job: Job, *, by) -> bool:
    """Queued jobs end at once; jobs with VMs go through `cancelling` until every
    live instance has ended. Returns False if the job was already finished.
    `by` is the person cancelling; the cancel is audited in the same transaction."""
    for _ in range(3):
        job.refresh_from_db(fields=["status"])
        if job.status == JobStatus.QUEUED:
            if transition_job(job.pk, JobStatus.QUEUED, JobStatus.CANCELLED, message=f"cancelled by {by}"):
                audit_job_cancelled(by, job)
                return True
        elif job.status in JobStatus.ACTIVE:
            if transition_job(job.pk, job.status, JobStatus.CANCELLING, message=f"cancelled by {by}"):
                for pk in Instance.objects.filter(job_id=job.pk, state__in=InstanceState.LIVE).values_list("pk", flat=True):
                    enqueue_terminate(pk)
                finish_cancelling(job.pk)
                audit_job_cancelled(by, job)
                return True
        else:
            return job.status == JobStatus.CANCELLING
    return False


def finish_cancelling(job_id: int) -> None:
    if not Instance.objects.filter(job_id=job_id, state__in=InstanceState.LIVE).exists():
        transition_job(job_id, JobStatus.CANCELLING, JobStatus.CANCELLED, message="every instance has ended")


@transaction.atomic
def register_instance(instance: Instance, *, hostname: str, agent_version: str, provider_instance_id: str) -> None:
    """The agent is up: the instance runs, and its resume checkpoint is fixed now. Its
    checkpoint interval is the fleet's to set (respawn_server.jobs.fleet.placement.refresh_interval)."""
    now = timezone.now()
    # A spare's checkpoint is fixed when it is promoted (promote_spare), not before the notice
    # save; a joiner's when its gang regroups with it.
    standing_by = instance.standby_for_id is not None or instance.joining
    resume = None if standing_by else usable_checkpoint(instance.job)
    if instance.state == InstanceState.REQUESTED:
        transition_instance(instance.pk, InstanceState.REQUESTED, InstanceState.BOOTING, message="agent registered")
    transition_instance(
        instance.pk,
        InstanceState.BOOTING,
        InstanceState.RUNNING,
        message="agent registered",
        registered_at=now,
        running_at=now,
        hostname=hostname[:200],
        agent_version=agent_version[:50],
        last_heartbeat_at=now,
        heartbeat_deadline=now + heartbeat_timeout(),
        resume_checkpoint=resume,
        # where its trainer starts, until it reports (a spare's heartbeats must not move the job's step back)
        last_step=resume.step if resume else (instance.job.last_step if standing_by else 0),
        # The VM's id as the cloud gave it at launch wins over the agent's word (it decides
        # which VM the control plane asks about and terminates); the agent's is taken only
        # when it registered before its launch was recorded.
        **({"provider_instance_id": provider_instance_id[:200]}
           if provider_instance_id and not instance.provider_instance_id else {}),
    )
    if instance.rank == 0 and instance.world_size > 1 and not instance.rendezvous_addr:
        Instance.objects.filter(job_id=instance.job_id, state__in=InstanceState.LIVE, rendezvous_addr="").update(
            rendezvous_addr=f"{hostname}:{GANG_PORT}")
    instance.refresh_from_db()
    # A gang's ranks register at once: under READ COMMITTED each would count only itself as
    # running and none would move the job on. The job's row lock orders the counts.
    job = Job.objects.select_for_update(of=("self",)).get(pk=instance.job_id)
    _running_once_all_registered(job)


def _running_once_all_registered(job: Job) -> None:
    """A provisioning job runs once every node of its gang has registered (an elastic
    gang's, as many as it has regrouped to)."""
    nodes = training_nodes(job.pk)
    if job.status == JobStatus.PROVISIONING and nodes.exists() and not nodes.exclude(
            state=InstanceState.RUNNING).exists() and nodes.count() == current_world_size(job):
        transition_job(job.pk, JobStatus.PROVISIONING, JobStatus.RUNNING, message="every node registered")


# Registers of a job's VMs the server may fail to answer before the job fails (cause
# `setup`): enough to ride out a blip, few enough that no VM is relaunched for long.
REGISTER_MAX_FAILURES = 5


@transaction.atomic
def register_failed(instance_id: int, error: str) -> int:
    """The server could not answer a register of this instance (a job spec it cannot
    build, say). Counted, and said on the job's page; once the job's VMs that never
    registered have failed REGISTER_MAX_FAILURES registers between them, the job fails.
    Returns that count."""
    Instance.objects.filter(pk=instance_id).update(register_failures=F("register_failures") + 1)
    instance = Instance.objects.get(pk=instance_id)
    failures = Instance.objects.filter(job_id=instance.job_id, registered_at__isnull=True).aggregate(
        n=Sum("register_failures"))["n"]
    log_job_event(instance.job_id, f"the control plane failed to answer the register of instance {instance.pk} "
                                   f"({failures} of {REGISTER_MAX_FAILURES} failures allowed): {error}")
    if failures >= REGISTER_MAX_FAILURES:
        give_up_registering(instance, f"the control plane failed {failures} registers of this job's VMs; "
                                      f"the last: {error}")
    return failures


def give_up_registering(instance: Instance, why: str) -> None:
    """The job's VMs cannot be given their spec: the job fails with cause `setup` and its
    VMs are terminated (a relaunch would fail the same way, billed on a cloud)."""
    if not end_instance(instance, EndReason.FAILED, message=why[:500]):
        return
    for pk in Instance.objects.filter(job_id=instance.job_id).filter(
            Q(state__in=InstanceState.LIVE) | Q(pk=instance.pk)).values_list("pk", flat=True):
        enqueue_terminate(pk)
    after_instance_ended(instance.job_id, EndReason.FAILED, failure_signature=why, setup_failure=True,
                         instance_id=instance.pk)


def agent_setup_failed(instance: Instance, message: str) -> None:
    """The VM's boot script could not install the agent (a wheel whose digest is not the
    pinned one, a download or pip that failed): no agent will ever run there, and a
    relaunch would boot the same script, so the job fails with cause `setup`."""
    give_up_registering(instance, f"instance {instance.pk}: the VM could not set up the agent: {message}")


def record_notice(instance: Instance, *, source: str, notice_time, deadline, raw: str) -> InterruptionEvent | None:
    """None for an instance that has already ended: the control plane terminated or fenced
    it, so the SIGTERM its agent reports as a notice is that shutdown, no interruption.
    Its state is read under lock: an instance fenced since its token was checked must not
    ask its replacement to stop."""
    instance = Instance.objects.select_for_update(of=("self",)).select_related("job").get(pk=instance.pk)
    if instance.state == InstanceState.ENDED:
        log_job_event(instance.job_id, f"notice from {source} for instance {instance.pk} ignored: the instance had "
                                       f"already ended ({instance.end_reason}), no spare is launched for it")
        return None
    # In a gang the save can outrun the notice's own report: rank 0's report of the gang's
    # notice save may arrive before the noticed rank's report of the notice. A save of a live
    # instance of the job committed after the notice answers it (a fenced VM's never does).
    early = Checkpoint.objects.filter(job_id=instance.job_id, kind=CheckpointKind.NOTICE, committed_at__gte=notice_time,
                                      instance__state__in=InstanceState.LIVE).order_by("committed_at").first()
    event = InterruptionEvent.objects.create(
        instance=instance,
        kind=InterruptionKind.NOTICE,
        source=source,
        notice_time=notice_time,
        deadline=deadline,
        raw=raw,
        checkpoint_saved=None if early is None else deadline is None or early.committed_at <= deadline,
    )
    if instance.state == InstanceState.RUNNING:
        transition_instance(instance.pk, InstanceState.RUNNING, InstanceState.PREEMPTING, message=f"notice from {source}")
    log_job_event(instance.job_id, f"preemption notice for instance {instance.pk} ({source})")
    if instance.joining:
        pass  # it trains nothing yet: its end leaves the gang as it is (_after_joiner_ended)
    elif instance.purpose == Purpose.TRAIN and instance.job.status == JobStatus.RUNNING:
        # Its replacement boots during the notice, a gang's every node's; the gang trains on
        # meanwhile and saves together once they are ready, or at once when none is coming.
        nudges.send_on_commit(nudges.LAUNCH_SPARE, instance.pk)
    else:
        # A gang saves together: every other node checkpoints the same step and stops (a spare
        # launched on a rebalance recommendation has no step to save: it stays, to take over).
        request_action(instance.job_id, Action.CHECKPOINT_AND_STOP, exclude=instance.pk, spares=False)
    return event


def request_action(job_id: int, action: str, *, exclude: int | None = None, spares: bool = True) -> None:
    live = Instance.objects.filter(job_id=job_id, state__in=InstanceState.LIVE).exclude(pk=exclude)
    (live if spares else live.filter(standby_for__isnull=True)).update(requested_action=action,
                                                                       requested_action_at=timezone.now())


def record_rebalance(instance: Instance, *, source: str, raw: str) -> None:
    """An AWS rebalance recommendation (elevated risk of a reclaim, no deadline), reported by
    the agent of a job with spare_on_rebalance: the instance is not interrupted and trains
    on; a spare is launched to move the job to, which, once prepared, asks this instance
    to checkpoint and stop (docs/spares.md, "Rebalance recommendations")."""
    instance = Instance.objects.select_for_update(of=("self",)).select_related("job").get(pk=instance.pk)
    job = instance.job
    if instance.state != InstanceState.RUNNING or not job.spare_on_rebalance or job.nodes != 1 or \
            instance.purpose != Purpose.TRAIN or instance.standby_for_id is not None or job.status != JobStatus.RUNNING:
        log_job_event(job.pk, f"rebalance recommendation from {source} for instance {instance.pk}: noted, no spare "
                              f"(instance {instance.state}, job {job.status}, {job.nodes} node(s), spare_on_rebalance "
                              f"{'on' if job.spare_on_rebalance else 'off'})")
        return
    log_job_event(job.pk, f"rebalance recommendation from {source} for instance {instance.pk}: launching a spare to "
                          "move the job to; the instance trains on until it is ready")
    nudges.send_on_commit(nudges.LAUNCH_SPARE, instance.pk)


def unvalidated_reason(job: Job) -> str:
    """Why no checkpoint of `job` can be validated (DESIGN §11 `skipped`), or "" when they can."""
    if not job.validation_enabled:
        return "not validated: validation is off for this job"
    if not (job.validation_model_factory and job.validation_batch_factory):
        return "not validated: the job names no validation model and batch factories to check it with"
    return ""


def record_checkpoint(instance: Instance, **fields) -> tuple[Checkpoint, bool]:
    """The checkpoint with this report's `checkpoint_id`, and whether it is new (else it
    was recorded before, maybe with other fields: the caller judges a resend). A new one
    changes the job's measured checkpoint cost: its caller refreshes the instance's interval."""
    # Recorded `skipped` at once when nothing will ever validate it, rather than `pending` forever.
    skipped = unvalidated_reason(instance.job)
    verdict = {"validation": ValidationResult.SKIPPED, "validation_message": skipped} if skipped else {}
    checkpoint_id = fields.pop("checkpoint_id")
    checkpoint, created = Checkpoint.objects.get_or_create(
        checkpoint_id=checkpoint_id, defaults={"job_id": instance.job_id, "instance": instance, **verdict, **fields})
    if not created:
        return checkpoint, False
    # A checkpoint of step N proves its VM trained to N: the curve's mark of the VM's end sits
    # at its notice save, not at the last heartbeat before it (one comes every 10 s).
    Instance.objects.filter(pk=instance.pk).update(last_step=Greatest("last_step", checkpoint.step))
    job = Job.objects.select_for_update(of=("self",)).select_related("newest_checkpoint").get(pk=instance.job_id)
    if job.newest_checkpoint is None or checkpoint.step >= job.newest_checkpoint.step:
        Job.objects.filter(pk=job.pk).update(newest_checkpoint=checkpoint)
    if checkpoint.kind == CheckpointKind.NOTICE:
        # In a gang, rank 0 commits the notice save of whichever node got the notice, and its
        # report may arrive after rank 0 itself has ended (lost to a heartbeat timeout under
        # load). An ended instance's save answers only notices received before it ended (the
        # control plane's clocks, not the VM's word): a fenced VM's late report never answers
        # its replacement's notice.
        notices = InterruptionEvent.objects.filter(instance__job_id=instance.job_id, kind=InterruptionKind.NOTICE,
                                                   checkpoint_saved__isnull=True)
        if instance.state == InstanceState.ENDED:
            notices = notices.filter(received_at__lte=instance.ended_at)
        notice = notices.last()
        if notice is not None:
            notice.checkpoint_saved = notice.deadline is None or checkpoint.committed_at <= notice.deadline
            notice.save(update_fields=["checkpoint_saved"])
        # After this transaction, whose job row lock must not be held while the job's endings are locked.
        transaction.on_commit(lambda: _hand_over_to_spares(instance.pk))
    if instance.requested_action == Action.CHECKPOINT:
        Instance.objects.filter(pk=instance.pk, requested_action=Action.CHECKPOINT).update(requested_action="")
    if live_joiners(job.pk).exists():
        # After this transaction too: the regroup writes the nodes' rows before the job's.
        transaction.on_commit(lambda: grow_with_joiners(job.pk))
    return checkpoint, True


def expire_pending_validations(now, batch: int) -> int:
    """Checkpoints no validator will ever judge are recorded `skipped`, saying why, rather
    than `pending` forever: their VM ended and its grace window for reports has passed (a
    VM stops validating at a notice; a resume validates only the checkpoint it loads). A
    verdict that still comes later replaces this one. Returns how many were recorded."""
    cutoff = now - timedelta(seconds=settings.RESPAWN["FENCE_GRACE_S"])
    stale = list(Checkpoint.objects.filter(validation=ValidationResult.PENDING, instance__state=InstanceState.ENDED,
                                           instance__ended_at__lt=cutoff).values_list("pk", flat=True)[:batch])
    return Checkpoint.objects.filter(pk__in=stale, validation=ValidationResult.PENDING).update(
        validation=ValidationResult.SKIPPED, validated_at=now,
        validation_message="not validated: its VM ended before a verdict came (a notice stops the VM's validator; "
                           "a resume validates the checkpoint it loads)")


def record_validation(checkpoint: Checkpoint, *, result: str, loss, message: str) -> None:
    checkpoint.validation = result
    checkpoint.validation_loss = loss
    checkpoint.validation_message = message[:500]
    checkpoint.validated_at = timezone.now()
    checkpoint.save(update_fields=["validation", "validation_loss", "validation_message", "validated_at"])
    if result == ValidationResult.VALID:
        job = Job.objects.select_for_update(of=("self",)).select_related("newest_valid_checkpoint").get(pk=checkpoint.job_id)
        if job.newest_valid_checkpoint is None or checkpoint.step >= job.newest_valid_checkpoint.step:
            Job.objects.filter(pk=job.pk).update(newest_valid_checkpoint=checkpoint)
    elif result == ValidationResult.INVALID:
        log_job_event(checkpoint.job_id, f"checkpoint at step {checkpoint.step} failed validation: {message}")
        checkpoint_invalid.send(sender=Checkpoint, checkpoint=checkpoint)
    elif result == ValidationResult.ERROR:
        log_job_event(checkpoint.job_id, f"checkpoint at step {checkpoint.step} could not be validated "
                                         f"(the check itself failed; the checkpoint is kept): {message}")


def record_prepare(instance: Instance, *, outcome: str, key: str, uri: str, seconds, message: str) -> None:
    """The job's events say how its prepare step went on each VM (its failure also ends the
    instance, through the exit report that follows)."""
    took = f" in {seconds:.1f}s" if seconds is not None else ""
    where = f"instance {instance.pk}" + (" (post step)" if instance.purpose == Purpose.POST else "")
    if outcome == PrepareOutcome.REUSED:
        text = f"prepare step skipped on {where}: outputs for key {key[:12]} already stored at {uri}"
    elif outcome == PrepareOutcome.RAN:
        stored = f"; outputs stored at {uri}" if uri else ""
        text = f"prepare step ran on {where}{took} (key {key[:12]}){stored}"
    else:
        text = f"prepare step failed on {where}{took}: {message}"
    log_job_event(instance.job_id, text)


EXIT_END_REASON = {
    ExitReason.COMPLETED: EndReason.COMPLETED,
    ExitReason.FAILED: EndReason.FAILED,
    ExitReason.SETUP: EndReason.FAILED,
    ExitReason.PREEMPTED: EndReason.PREEMPTED,
}


def record_exit(instance: Instance, *, reason: str, exit_code, final_step, output_tail: str, last_exception: str,
                artifact_uri: str, artifact_digest: str) -> None:
    if reason == ExitReason.STOPPED:
        end_reason = EndReason.CANCELLED if instance.job.status == JobStatus.CANCELLING else EndReason.FENCED
    else:
        end_reason = EXIT_END_REASON[reason]
    if final_step is not None:  # an ended instance's progress is over: a late exit report cannot add to it
        Instance.objects.filter(pk=instance.pk, state__in=InstanceState.LIVE, last_step__lt=final_step).update(
            last_step=final_step)
    if not end_instance(instance, end_reason, message=f"agent exit: {reason} (code {exit_code})"):
        # The instance had already ended (lost, fenced) when this report arrived: its
        # job has moved on, maybe to a new gang, which an old report must not stop,
        # and its steps are not the job's progress.
        return
    if instance.job.nodes == 1:
        # Its agent reports a notice checkpoint before its exit, and no other node can commit
        # one for it: a notice still open now was met with none (the save missed its budget).
        _record_missed_notice(instance, final_step)
    signature = f"exit {exit_code}: {last_exception}".strip()
    after_instance_ended(instance.job_id, end_reason, failure_signature=signature, output_tail=output_tail,
                         setup_failure=reason == ExitReason.SETUP, instance_id=instance.pk)
    if instance.purpose != Purpose.TRAIN:
        return  # a post step's steps and files are not the job's
    # The job's row is written last, after any of its other instances were asked to
    # stop, in the order a heartbeat locks rows (instance, then job): no lock cycle.
    progress = {"last_step": final_step} if final_step is not None else {}
    if artifact_uri and reason == ExitReason.COMPLETED:
        progress.update(artifact_uri=artifact_uri, artifact_digest=artifact_digest)
    if progress:
        Job.objects.filter(pk=instance.job_id).update(**progress)


def after_instance_ended(job_id: int, end_reason: str, *, failure_signature: str = "", output_tail: str = "",
                         setup_failure: bool = False, instance_id: int | None = None) -> bool:
    """Move the job on after one of its instances ended, in the transaction that ended
    it: respawn_server.jobs.core.transitions.end_instance took the job's lock, so when two ranks end at
    once the second decision sees the first. Returns whether an elastic gang went on
    without the instance (go_on_with_survivors)."""
    job = Job.objects.get(pk=job_id)
    if instance_id is not None and Instance.objects.filter(pk=instance_id, joining=True).exists():
        _after_joiner_ended(job, instance_id, end_reason)
        return False
    if instance_id is not None and Instance.objects.filter(pk=instance_id, standby_for__isnull=False).exists():
        _after_spare_ended(job, instance_id, end_reason)
        return False
    # Joiners grow the gang that launched them; a node of it ended first (lost, done, failed...).
    release_joiners(job_id, f"instance {instance_id} ended {end_reason} before the gang took them in")
    spares = Instance.objects.filter(job_id=job_id, state__in=InstanceState.LIVE, standby_for__isnull=False)
    if spares.filter(standby_for__state=InstanceState.ENDED).exists():
        if end_reason in SPARE_TAKES_OVER and job.status in (JobStatus.RUNNING, JobStatus.PROVISIONING):
            if spares.filter(standby_for__state__in=InstanceState.LIVE).exists():
                # A gang hands over whole, once its last node has ended: the others save the
                # same step and stop (no collective goes on with a node gone), then its spares train.
                request_action(job_id, Action.STOP if end_reason == EndReason.LOST else Action.CHECKPOINT_AND_STOP,
                               spares=False)
            else:
                promote_spares(job, list(spares.select_related("standby_for")))
            return False
        release_spares(job_id, f"instance {instance_id} ended {end_reason}: no replacement is needed")
    if job.status == JobStatus.CANCELLING:
        finish_cancelling(job_id)
        return False
    if job.status == JobStatus.FINISHING:
        _after_post_instance(job, failure_signature, output_tail, setup_failure, instance_id)
        return False
    if job.status not in JobStatus.ACTIVE:
        return False
    if end_reason == EndReason.COMPLETED:
        _maybe_succeed(job)
    elif end_reason == EndReason.FAILED:
        _after_failure(job, failure_signature, output_tail, setup_failure, instance_id)
    elif end_reason in (EndReason.PREEMPTED, EndReason.LOST, EndReason.CAPACITY_ERROR):
        if go_on_with_survivors(job, end_reason, instance_id):
            return True
        _after_interruption(job, end_reason, instance_id)
    else:
        _after_stop(job)
    return False


def training_nodes(job_id: int):
    """The job's live training instances that hold a node slot (not spares, not joiners,
    not a post step)."""
    return Instance.objects.filter(job_id=job_id, state__in=InstanceState.LIVE, standby_for__isnull=True,
                                   joining=False, purpose=Purpose.TRAIN)


def live_joiners(job_id: int):
    """The job's live joiners: launched to grow its elastic gang back (docs/elastic.md)."""
    return Instance.objects.filter(job_id=job_id, state__in=InstanceState.LIVE, joining=True)


def current_world_size(job: Job) -> int:
    """The nodes the job's gang trains on now: its newest world size, else all it asked for."""
    return job.world_sizes.order_by("-at", "-id").values_list("world_size", flat=True).first() or job.nodes


def free_local_address() -> str:
    """A rendezvous address for a gang of local "VMs", which share this machine: a port
    free here now, below the kernel's ephemeral range. A port from that range (bind to
    0) can be taken by any outgoing connection (a heartbeat, a query) in the seconds
    before rank 0's trainer binds it, and the gang's trainers then fail on EADDRINUSE."""
    ephemeral_low = _lowest_ephemeral_port()
    for port in random.sample(range(max(1024, ephemeral_low - 16384), ephemeral_low), 64):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return f"127.0.0.1:{port}"
    raise OSError("no free port below the ephemeral range for a local gang's rendezvous")


def _lowest_ephemeral_port() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; other systems' ranges start higher


def go_on_with_survivors(job: Job, end_reason: str, instance_id: int | None) -> bool:
    """A node of an elastic gang was lost (preempted, lost, or refused for capacity
    while the gang was placed): with at least nodes_min nodes left, they go on without
    it (regroup), and no gang is relaunched. Whether they did."""
    if not job.elastic or job.status not in (JobStatus.RUNNING, JobStatus.PROVISIONING):
        return False
    survivors = list(training_nodes(job.pk).select_related("resume_checkpoint").order_by("rank"))
    what = f"instance {instance_id} {end_reason}" if instance_id is not None else f"a node {end_reason}"
    if len(survivors) < job.nodes_min:
        log_job_event(job.pk, f"{what}: {len(survivors)} node(s) left, fewer than the {job.nodes_min} the job "
                              "trains on at least; the gang is relaunched whole")
        return False
    regroup(job, survivors, f"{what}: the gang goes on with {len(survivors)} of {job.nodes} nodes", after=instance_id)
    if end_reason in (EndReason.PREEMPTED, EndReason.LOST) and not caused_by_drill(instance_id):
        # The job's row last, after the instances': the order a heartbeat locks them in.
        Job.objects.filter(pk=job.pk).update(preemptions=F("preemptions") + 1)
    return True


def regroup(job: Job, nodes: list[Instance], why: str, *, after: int | None = None) -> None:
    """Make `nodes` (in rank order) the job's gang: ranks 0..n-1 of world size n, a fresh
    rendezvous, the newest usable checkpoint to resume from (resharded by the trainer's
    checkpointer), and a new generation, which their heartbeat answers carry: each agent
    then restarts its trainer (respawn.agent.lifecycle). A node not yet registered learns
    it all from its register answer. Ranks only move down, so taking the rows in rank
    order keeps one live instance per slot at every statement, and the job's row is
    written only after them (a survivor's heartbeat locks its instance, then the job:
    the other order deadlocks with it). Each node's run until now
    is kept in its earlier_runs, for the money (the work each run kept); `after`: the
    instance whose loss caused it."""
    resume = usable_checkpoint(job)
    now = timezone.now()
    generation = max(node.gang_generation for node in nodes) + 1
    first = nodes[0]
    if first.provider == "local":
        addr = free_local_address()
    else:  # rank 0's host, known once it registered (register_instance sets it then)
        addr = f"{first.hostname}:{GANG_PORT}" if first.hostname else ""
    for rank, node in enumerate(nodes):
        ran = {"rank": node.rank, "resume_step": node.resume_checkpoint.step if node.resume_checkpoint else 0,
               "resume_from": node.resume_checkpoint.instance_id if node.resume_checkpoint else None,
               "last_step": node.last_step, "kept_until": resume.step if resume else 0, "until": now.isoformat()}
        Instance.objects.filter(pk=node.pk).update(
            rank=rank, world_size=len(nodes), rendezvous_addr=addr, gang_generation=generation,
            trainer_exited_at=None, resume_checkpoint=resume, last_step=resume.step if resume else 0, joining=False,
            earlier_runs=[*node.earlier_runs, ran] if node.registered_at and not node.joining else [])
    # A checkpoint asked of a trainer that now restarts is void (a joiner's readiness asks one).
    Instance.objects.filter(pk__in=[node.pk for node in nodes], requested_action=Action.CHECKPOINT).update(
        requested_action="")
    WorldSize.objects.create(job=job, at=now, world_size=len(nodes), reason=why, after_instance_id=after,
                             resume_checkpoint=resume)
    log_job_event(job.pk, f"{why}, from " + (f"step {resume.step}" if resume else "the start")
                  + f" (elastic gang, generation {generation})")
    _running_once_all_registered(Job.objects.get(pk=job.pk))


def joiner_ready(joiner: Instance) -> None:
    """A joiner, booted and prepared, asked whether it may train. Once every joiner of the
    job is ready, the gang is asked for a checkpoint (of rank 0: a request to any rank
    saves the same step on all), at whose commit it grows (grow_with_joiners). The joiners
    are locked first, so two asking at once see each other's mark."""
    with transaction.atomic():
        joiners = list(live_joiners(joiner.job_id).select_for_update().order_by("pk"))
        if not Instance.objects.filter(pk=joiner.pk, standby_ready_at__isnull=True).update(
                standby_ready_at=timezone.now()):
            return  # asked before: the checkpoint, if due, was asked for then
        if any(other.standby_ready_at is None for other in joiners if other.pk != joiner.pk):
            return
        asked = training_nodes(joiner.job_id).filter(rank=0, requested_action="").update(
            requested_action=Action.CHECKPOINT, requested_action_at=timezone.now())
    log_job_event(joiner.job_id, f"joiner instance{'s' if len(joiners) > 1 else ''} "
                                 f"{', '.join(str(j.pk) for j in joiners)} ready: the gang "
                                 + ("is asked for a checkpoint and grows when it commits" if asked else
                                    "grows at its next checkpoint"))


def grow_with_joiners(job_id: int) -> bool:
    """A checkpoint of the job committed: if every joiner of it is ready, the gang regroups
    with them from that checkpoint, at its full size (docs/elastic.md). Nothing while a
    node's trainer has exited (a regroup or a stop is being decided) or spares stand by (a
    notice hands the gang over first). Whether it grew."""
    with transaction.atomic():
        lock_job_endings(job_id)  # no node ends, and no other regroup happens, meanwhile
        joiners = list(live_joiners(job_id).select_for_update().order_by("pk"))
        if not joiners or any(j.state != InstanceState.RUNNING or j.standby_ready_at is None for j in joiners):
            return False
        job = Job.objects.get(pk=job_id)
        nodes = list(training_nodes(job_id).select_related("resume_checkpoint").order_by("rank"))
        spares = Instance.objects.filter(job_id=job_id, state__in=InstanceState.LIVE, standby_for__isnull=False)
        if job.status != JobStatus.RUNNING or not nodes or any(n.trainer_exited_at for n in nodes) or spares.exists():
            return False
        regroup(job, nodes + joiners, f"capacity is back: the gang grows from {len(nodes)} to "
                                      f"{len(nodes) + len(joiners)} of {job.nodes} nodes")
        return True


def trainer_exited(instance: Instance, *, exit_code: int, generation: int) -> None:
    """An elastic gang's node says its trainer exited (a heartbeat's trainer_exit_code)
    and waits for the gang's word. Said about the gang it trains in now, the first time
    only, a worker asks the cloud about its peers (respawn_server.jobs.fleet.orchestration.check_elastic_gang);
    a word about an older generation is a node that has not yet seen the regroup, and
    one from a job that is not elastic is no word at all."""
    if Instance.objects.filter(pk=instance.pk, state__in=InstanceState.LIVE, gang_generation=generation,
                               job__nodes_min__lt=F("job__nodes"), trainer_exited_at__isnull=True).update(
            trainer_exited_at=timezone.now()):
        log_job_event(instance.job_id, f"instance {instance.pk}: its trainer exited (code {exit_code}); the gang's "
                                       "peers are put to the cloud before the code is blamed")
        nudges.send_on_commit(nudges.CHECK_ELASTIC_GANG, instance.job_id)


# The ends of an instance after which the spare launched on its notice takes its slot.
SPARE_TAKES_OVER = (EndReason.PREEMPTED, EndReason.LOST, EndReason.FENCED)


def promote_spares(job: Job, spares: list[Instance]) -> None:
    """Every instance the job's spares stood by for has ended (stopped after the notice
    save, or gone): each spare takes its node slot now, all resuming from the newest usable
    checkpoint, which their agents read from `standby`. One interruption, counted once
    when a VM was reclaimed or lost (a planned move is not a preemption). The job passes
    through recovering and provisioning as any relaunch does (the table of DESIGN §4), and
    is running again at once when every spare has registered. Clearing standby_for while
    an old instance still lived would break the one-live-instance-per-slot constraint."""
    resume = usable_checkpoint(job)
    olds = [spare.standby_for for spare in spares]
    for spare in spares:
        Instance.objects.filter(pk=spare.pk).update(
            standby_for=None, **({"resume_checkpoint": resume, "last_step": resume.step if resume else 0}
                                 if spare.state == InstanceState.RUNNING else {}))
    interrupted = any(old.end_reason in (EndReason.PREEMPTED, EndReason.LOST) and not caused_by_drill(old.pk)
                      for old in olds)
    counted = {"preemptions": F("preemptions") + 1} if interrupted else {}
    transition_job(job.pk, job.status, JobStatus.RECOVERING,
                   message=", ".join(f"instance {old.pk} {old.end_reason}" for old in olds), **counted)
    names = ", ".join(str(spare.pk) for spare in spares)
    transition_job(job.pk, JobStatus.RECOVERING, JobStatus.PROVISIONING,
                   message=f"spare instance{'s' if len(spares) > 1 else ''} {names}, launched on the notice, "
                           f"take{'' if len(spares) > 1 else 's'} over" + (f" from step {resume.step}" if resume else ""))
    if all(spare.state == InstanceState.RUNNING for spare in spares):
        transition_job(job.pk, JobStatus.PROVISIONING, JobStatus.RUNNING, message="the spares had registered")
    for spare, old in zip(spares, olds):
        log_job_event(job.pk, f"spare instance {spare.pk} promoted; {overlap_words(spare, old.ended_at)}")


def overlap_words(spare: Instance, until) -> str:
    """The price of a spare's overlap with the instance it stood by for, in words: the
    ledger bills the spare from its launch like any instance (its waiting is boot time, no
    kept work, so the savings baseline gains nothing from it); this names that share."""
    seconds = max(0.0, (until - spare.requested_at).total_seconds())
    price = spare.price_per_hour_at_launch
    cost = f", about ${price * Decimal(seconds) / 3600:.4f} at ${price}/h" if price is not None else ""
    return f"it ran {seconds:.0f}s beside instance {spare.standby_for_id}{cost}: the price of the overlap"


@transaction.atomic
def _hand_over_to_spares(instance_id: int) -> None:
    """An instance committed the notice save (a gang's rank 0 commits every rank's), the
    last thing its trainer does: when a spare stands by for every live node, the noticed
    node ends now (preempted) rather than after its agent's exit report, which is still
    taken in its grace window. The rest of a gang stops with the save and ends on its
    agents' exit reports (a VM ended here would be reaped under an agent still reporting);
    the last end promotes the spares (after_instance_ended)."""
    instance = Instance.objects.select_related("job").get(pk=instance_id)
    nodes = training_nodes(instance.job_id)
    if instance.state == InstanceState.ENDED or not nodes.exists() or nodes.exclude(
            spares__state__in=InstanceState.LIVE).exists():
        return
    noticed = list(nodes.filter(interruptions__kind=InterruptionKind.NOTICE).distinct())
    if noticed:
        ending = [(node, EndReason.PREEMPTED, "notice checkpoint committed; its spare takes over") for node in noticed]
    elif instance.job.nodes == 1:  # moved off on a rebalance recommendation: a planned move, no preemption
        ending = [(instance, EndReason.FENCED, "checkpoint committed on a rebalance recommendation; its spare takes over")]
    else:
        return
    for node, end_reason, why in ending:
        if end_instance(node, end_reason, message=why):
            after_instance_ended(node.job_id, end_reason, instance_id=node.pk)


def end_notice_hold(instance_id: int, *, spare_ready: bool = False) -> None:
    """A VM trains on while its spare boots (a noticed one, JobSpec.notice_hold, or one told
    of a rebalance), and so does the rest of its gang: tell them to save and stop now,
    because the spares are ready, or, for a noticed one only, because none is coming
    (without a notice it just trains on). A gang saves and stops together."""
    held = Instance.objects.filter(pk=instance_id).select_related("job").first()
    if held is None:
        return
    nodes = training_nodes(held.job_id) if held.job.nodes > 1 else Instance.objects.filter(
        pk=held.pk, state__in=InstanceState.LIVE)
    if not spare_ready and not nodes.filter(state=InstanceState.PREEMPTING).exists():
        return
    nodes.exclude(requested_action=Action.CHECKPOINT_AND_STOP).update(requested_action=Action.CHECKPOINT_AND_STOP,
                                                                      requested_action_at=timezone.now())


def spare_ready(spare: Instance) -> None:
    """A spare, booted and prepared, asked whether it may train. Once every spare of the
    job is ready, the instances they stand by for are told to save and stop: a gang hands
    over whole, never with a node slot waiting on a spare still booting. (Two spares asking
    at once may each miss the other's mark; they ask again in half a second.) `spare` may have
    been read before its promotion: its row is read again, locked, and a spare promoted since
    is a node of the new gang, which must not be told to stop."""
    with transaction.atomic():
        standing_by = Instance.objects.select_for_update(of=("self",)).filter(
            pk=spare.pk, standby_for__isnull=False).values_list("standby_for_id", flat=True).first()
        if standing_by is None:
            return
        Instance.objects.filter(pk=spare.pk, standby_ready_at__isnull=True).update(standby_ready_at=timezone.now())
        if not Instance.objects.filter(job_id=spare.job_id, state__in=InstanceState.LIVE, standby_for__isnull=False,
                                       standby_ready_at__isnull=True).exists():
            end_notice_hold(standing_by, spare_ready=True)


def _fence(instances, message: str) -> list[Instance]:
    """End each of `instances`, whose VM the job will not need (fenced), and terminate
    the VM; returns those this call ended."""
    ended = [instance for instance in instances if end_instance(instance, EndReason.FENCED, message=message[:500])]
    for instance in ended:
        if instance.provider_instance_id:
            enqueue_terminate(instance.pk)
    return ended


def release_spares(job_id: int, why: str) -> int:
    """End the job's spares, which will not be needed, and terminate their VMs. A gang's
    go together: a gang hands over whole or not at all. Returns how many ended."""
    spares = _fence(Instance.objects.filter(job_id=job_id, state__in=InstanceState.LIVE, standby_for__isnull=False),
                    f"spare released: {why}")
    for spare in spares:
        log_job_event(job_id, f"spare instance {spare.pk} released ({why}); "
                              f"{overlap_words(spare, spare.ended_at or timezone.now())}")
    return len(spares)


def release_joiners(job_id: int, why: str) -> int:
    """End the job's joiners, which the gang will not take in, and terminate their VMs: a
    gang grows whole or not at all, and only the gang that launched them. Returns how
    many ended."""
    joiners = _fence(live_joiners(job_id), f"joiner released: {why}")
    if joiners:
        log_job_event(job_id, f"{len(joiners)} joiner(s) released: {why}")
    return len(joiners)


def _after_joiner_ended(job: Job, joiner_id: int, end_reason: str) -> None:
    """A joiner ended before its gang took it in (no capacity, never registered, lost,
    preempted, released): the gang trains on at its size, without the rest of the joiners,
    and tries to grow again GROW_RETRY_S later (respawn_server.jobs.fleet.orchestration.grow_elastic_gangs)."""
    if end_reason != EndReason.FENCED:
        log_job_event(job.pk, f"joiner instance {joiner_id} ended {end_reason}; the gang trains on at its size and "
                              f"tries to grow again in {settings.RESPAWN['GROW_RETRY_S']:.0f}s")
    release_joiners(job.pk, f"joiner instance {joiner_id} of the same growth ended {end_reason}")
    if job.status == JobStatus.CANCELLING:
        finish_cancelling(job.pk)


def _after_spare_ended(job: Job, spare_id: int, end_reason: str) -> None:
    """A spare ended before it was promoted (it never registered, was lost, was released):
    the job goes on as without one, and without the rest of its gang's spares, which are
    released (a gang hands over whole or not at all); if its old instance has ended
    meanwhile, the scheduler relaunches as usual."""
    spare = Instance.objects.get(pk=spare_id)
    end_notice_hold(spare.standby_for_id)
    if end_reason != EndReason.FENCED:
        log_job_event(job.pk, f"spare instance {spare_id} ended {end_reason} before it was needed; the job "
                              "recovers without it if its instance is interrupted")
    release_spares(job.pk, f"spare instance {spare_id} of the same gang ended {end_reason}")
    if job.status == JobStatus.RECOVERING and not Instance.objects.filter(
            job=job, state__in=InstanceState.LIVE).exists():
        nudge_schedule()
    elif job.status == JobStatus.CANCELLING:
        finish_cancelling(job.pk)


def _after_stop(job: Job) -> None:
    """A node stopped (fenced, or exited `stopped` unasked). In a recovering gang the
    last one down lets the gang relaunch; a running job with no node left is recovered,
    never left `running` with nothing running it."""
    if job.status == JobStatus.RECOVERING:
        nudge_schedule()
    elif job.status in (JobStatus.RUNNING, JobStatus.PROVISIONING) and not Instance.objects.filter(
            job=job, state__in=InstanceState.LIVE).exists():
        if transition_job(job.pk, job.status, JobStatus.RECOVERING, message="every node stopped"):
            nudge_schedule()


def _maybe_succeed(job: Job) -> None:
    if Instance.objects.filter(job=job, state__in=InstanceState.LIVE).exists():
        return
    completed = set(Instance.objects.filter(job=job, purpose=Purpose.TRAIN, end_reason=EndReason.COMPLETED)
                    .values_list("rank", flat=True))
    if completed < set(range(current_world_size(job))):
        return
    if not job.post_command:
        transition_job(job.pk, JobStatus.RUNNING, JobStatus.SUCCEEDED, message="training completed")
    elif transition_job(job.pk, JobStatus.RUNNING, JobStatus.FINISHING,
                        message="training completed; the post step starts on an on-demand VM"):
        nudge_schedule()  # respawn_server.jobs.fleet.orchestration.start_post_steps launches it


def _after_post_instance(job: Job, signature: str, output_tail: str, setup_failure: bool,
                         instance_id: int | None) -> None:
    """The post step's VM ended: its outcome is the job's. A failing post step fails the
    job (cause user_code, or setup), with the artifact still recorded; a VM lost, preempted
    or refused for capacity is replaced by the scheduler (respawn_server.jobs.fleet.orchestration.start_post_steps)."""
    post = Instance.objects.filter(job=job, purpose=Purpose.POST).order_by("-pk").first()
    if post is None or post.state in InstanceState.LIVE or instance_id not in (None, post.pk):
        return  # a late report of a training VM, or the post step still runs
    if post.end_reason == EndReason.COMPLETED:
        transition_job(job.pk, JobStatus.FINISHING, JobStatus.SUCCEEDED,
                       message=f"training completed; post step succeeded on instance {post.pk}")
    elif post.end_reason == EndReason.FAILED:
        transition_job(job.pk, JobStatus.FINISHING, JobStatus.FAILED, message=f"post step failed ({signature})",
                       failure_cause=FailureCause.SETUP if setup_failure else FailureCause.USER_CODE,
                       failure_message=failure_message(f"post step: {signature}", output_tail))
    else:
        log_job_event(job.pk, f"post step instance {post.pk} ended {post.end_reason}; launching another")
        nudge_schedule()


def _after_interruption(job: Job, end_reason: str, instance_id: int | None = None) -> None:
    # Stop the rest of a gang: no collective can go on with a node gone.
    request_action(job.pk, Action.STOP if end_reason == EndReason.LOST else Action.CHECKPOINT_AND_STOP)
    if job.status in (JobStatus.RUNNING, JobStatus.PROVISIONING):
        # A drill's interruption is recovered from like any other, and counted as none.
        counted = {"preemptions": F("preemptions") + 1} if end_reason != EndReason.CAPACITY_ERROR and \
            not caused_by_drill(instance_id) else {}
        if transition_job(job.pk, job.status, JobStatus.RECOVERING, message=f"instance {end_reason}", **counted):
            nudge_schedule()


def _after_failure(job: Job, signature: str, output_tail: str, setup_failure: bool, instance_id: int | None) -> None:
    if job.status == JobStatus.RECOVERING:
        _after_stop(job)  # an interruption moved the job on first: the failure followed from it
        return
    request_action(job.pk, Action.STOP)
    if job.nodes > 1 and not setup_failure and Instance.objects.filter(job=job, state__in=InstanceState.LIVE).exists():
        # A rank also fails when a peer's VM vanishes (its collectives break): the
        # cloud is asked about the peers before the code is blamed.
        nudges.send_on_commit(nudges.CHECK_GANG_FAILURE, job.pk, signature, output_tail, instance_id)
        return
    judge_failure(job, signature, output_tail, setup_failure)


def judge_failure(job: Job, signature: str, output_tail: str, setup_failure: bool = False) -> None:
    """The user's code failed: relaunch, or fail the job if it failed the same way twice."""
    same_again = signature == job.last_failure_signature
    too_many = job.failure_restarts >= job.max_restarts
    if setup_failure or same_again or too_many:
        cause = FailureCause.SETUP if setup_failure else FailureCause.USER_CODE
        why = "failed the same way twice" if same_again else ("setup failed" if setup_failure else "too many restarts")
        transition_job(job.pk, job.status, JobStatus.FAILED, message=why, failure_cause=cause,
                       failure_message=failure_message(signature, output_tail))
    else:
        if transition_job(job.pk, job.status, JobStatus.RECOVERING, message=f"user code failed ({signature})",
                          failure_restarts=F("failure_restarts") + 1, last_failure_signature=signature):
            nudge_schedule()


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
        steps_lost=_steps_since_checkpoint(instance),
    )
    log.info("instance %s of job %s marked lost: no heartbeat since %s", instance.pk, instance.job_id,
             instance.last_heartbeat_at)
    after_instance_ended(instance.job_id, EndReason.LOST, instance_id=instance.pk)
    return True


def _steps_since_checkpoint(instance: Instance, reached: int | None = None) -> int:
    newest = instance.job.checkpoints.order_by("-step").values_list("step", flat=True).first() or 0
    return max(0, max(instance.last_step, reached or 0) - newest)


def _record_missed_notice(instance: Instance, final_step: int | None) -> None:
    """A notice of `instance` still open at its exit was met with no committed save: say so
    on the notice and the job's events, with the steps the job redoes from its newest checkpoint."""
    lost = _steps_since_checkpoint(instance, final_step)
    if InterruptionEvent.objects.filter(instance=instance, kind=InterruptionKind.NOTICE,
                                        checkpoint_saved__isnull=True).update(checkpoint_saved=False, steps_lost=lost):
        log_job_event(instance.job_id, f"notice missed on instance #{instance.pk}: no checkpoint was committed before "
                                       f"its deadline, so the {lost} step(s) since the newest checkpoint are trained again")
