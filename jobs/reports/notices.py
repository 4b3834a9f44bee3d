"""A preemption notice or a rebalance recommendation an agent reports: recorded, and
the spare or the gang's save it calls for asked of the workers."""

from __future__ import annotations

from respawn.protocol import Action, CheckpointKind, Purpose
from respawn_server.jobs.core import nudges
from respawn_server.jobs.core.choices import InstanceState, InterruptionKind, JobStatus
from respawn_server.jobs.core.services import request_action
from respawn_server.jobs.core.transitions import log_job_event, transition_instance
from respawn_server.jobs.models import Checkpoint, Instance, InterruptionEvent


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
