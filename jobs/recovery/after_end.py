"""What a job does after one of its instances ended: a spare or a joiner ended, a
gang hands over to its spares, the job succeeds, recovers, goes on smaller, or
fails; and the endings that lead there (the notice save's handover, registers given up)."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q

from respawn.protocol import Action, Purpose
from respawn_server.jobs.core import nudges
from respawn_server.jobs.core.choices import EndReason, FailureCause, InstanceState, InterruptionKind, JobStatus
from respawn_server.jobs.core.services import enqueue_terminate, finish_cancelling, nudge_schedule, request_action
from respawn_server.jobs.core.transitions import end_instance, log_job_event, transition_job
from respawn_server.jobs.models import Instance, Job, failure_message
from respawn_server.jobs.recovery.counting import counts_as_preemption
from respawn_server.jobs.recovery.elastic import go_on_with_survivors
from respawn_server.jobs.recovery.gangs import current_world_size, training_nodes
from respawn_server.jobs.recovery.joiners import release_joiners
from respawn_server.jobs.recovery.spares import end_notice_hold, promote_spares, release_spares


# The ends of an instance after which the spare launched on its notice takes its slot.
SPARE_TAKES_OVER = (EndReason.PREEMPTED, EndReason.LOST, EndReason.FENCED)


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


@transaction.atomic
def hand_over_to_spares(instance_id: int) -> None:
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


def _after_joiner_ended(job: Job, joiner_id: int, end_reason: str) -> None:
    """A joiner ended before its gang took it in (no capacity, never registered, lost,
    preempted, released): the gang trains on at its size, without the rest of the joiners,
    and tries to grow again GROW_RETRY_S later (respawn_server.jobs.recovery.joiners.grow_elastic_gangs)."""
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
        nudge_schedule()  # respawn_server.jobs.fleet.post_steps.start_post_steps launches it


def _after_post_instance(job: Job, signature: str, output_tail: str, setup_failure: bool,
                         instance_id: int | None) -> None:
    """The post step's VM ended: its outcome is the job's. A failing post step fails the
    job (cause user_code, or setup), with the artifact still recorded; a VM lost, preempted
    or refused for capacity is replaced by the scheduler (respawn_server.jobs.fleet.post_steps.start_post_steps)."""
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
        counted = {"preemptions": F("preemptions") + 1} if counts_as_preemption(end_reason, instance_id) else {}
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
