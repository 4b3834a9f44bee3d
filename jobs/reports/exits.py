"""An agent's exit report: the instance ends as the agent says, a notice it left
unsaved is said to be missed, and the job's progress is kept."""

from __future__ import annotations

from respawn.protocol import ExitReason, Purpose
from respawn_server.jobs.core.choices import EndReason, InstanceState, InterruptionKind, JobStatus
from respawn_server.jobs.core.services import steps_since_checkpoint
from respawn_server.jobs.core.transitions import end_instance, log_job_event
from respawn_server.jobs.models import Instance, InterruptionEvent, Job
from respawn_server.jobs.recovery.after_end import after_instance_ended


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


def _record_missed_notice(instance: Instance, final_step: int | None) -> None:
    """A notice of `instance` still open at its exit was met with no committed save: say so
    on the notice and the job's events, with the steps the job redoes from its newest checkpoint."""
    lost = steps_since_checkpoint(instance, final_step)
    if not InterruptionEvent.objects.filter(instance=instance, kind=InterruptionKind.NOTICE,
                                            checkpoint_saved__isnull=True).update(checkpoint_saved=False, steps_lost=lost):
        return
    if lost:
        log_job_event(instance.job_id, f"notice missed on instance #{instance.pk}: no checkpoint was committed before "
                                       f"its deadline, so the {lost} step(s) since the newest checkpoint are trained again")
    else:  # e.g. a trainer still starting when the notice came
        log_job_event(instance.job_id, f"notice on instance #{instance.pk} met no checkpoint, and needed none: no step "
                                       "was seen trained past the newest checkpoint, so nothing is trained again")
