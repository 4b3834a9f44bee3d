"""A drill's report: each phase of the recovery as the control plane saw it, measured from
the moment the cloud accepted the interruption, and the verdict against the job's notice
window with the cause of a failure named. Derived from the job's own rows (notices,
checkpoints, instances, metrics), written back to the drill as the phases arrive."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.utils import timezone

from respawn_server.jobs.core.choices import CheckpointKind, DrillStatus, InterruptionKind, JobStatus, ValidationResult
from respawn_server.jobs.models import Checkpoint, Drill, Instance, InterruptionEvent, Job, MetricPoint

PHASES = ("notice_seen_at", "save_committed_at", "replacement_requested_at", "replacement_booted_at", "validated_at",
          "training_again_at")
GB = 1e9


def refresh(drill: Drill) -> Drill:
    """Bring a sent drill's phases and verdict up to date (a no-op once judged)."""
    if drill.status != DrillStatus.SENT or drill.interrupted_at is None:
        return drill
    found, notice, save = _phases(drill)
    changed = {name: value for name, value in found.items() if getattr(drill, name) != value}
    verdict = _verdict(drill, found, notice, save)
    if verdict is not None:
        passed, cause = verdict
        changed.update(cause=cause, finished_at=timezone.now())
        status = DrillStatus.PASSED if passed else DrillStatus.FAILED
        if Drill.objects.filter(pk=drill.pk, status=DrillStatus.SENT).update(status=status, **changed):
            changed["status"] = status
    elif changed:
        Drill.objects.filter(pk=drill.pk).update(**changed)
    for name, value in changed.items():
        setattr(drill, name, value)
    return drill


def _phases(drill: Drill) -> tuple[dict, InterruptionEvent | None, Checkpoint | None]:
    """The phases' moments and figures, with the notice and the notice save they came from."""
    since = drill.interrupted_at
    notice = InterruptionEvent.objects.filter(instance=drill.instance_id, kind=InterruptionKind.NOTICE,
                                              received_at__gte=since).order_by("received_at").first()
    save = Checkpoint.objects.filter(job=drill.job_id, kind=CheckpointKind.NOTICE,
                                     committed_at__gte=since).order_by("committed_at").first()
    replacement = Instance.objects.filter(job=drill.job_id, rank=drill.rank, requested_at__gte=since).exclude(
        pk=drill.instance_id).order_by("requested_at", "pk").first()
    found = {
        "notice_seen_at": notice.received_at if notice else None,
        "save_committed_at": save.committed_at if save else None,
        "replacement_requested_at": replacement.requested_at if replacement else None,
        "replacement_booted_at": replacement.registered_at if replacement else None,
        "validated_at": None,
        "training_again_at": None,
        "window_s": _window_s(notice),
        "steps_lost": None,
    }
    if replacement is not None and replacement.registered_at is not None:
        resume = replacement.resume_checkpoint
        if resume is not None and resume.validation == ValidationResult.VALID:
            found["validated_at"] = resume.validated_at
        first = MetricPoint.objects.filter(instance=replacement, step__gt=resume.step if resume else 0).order_by(
            "time").first()
        found["training_again_at"] = first.time if first else None
        interrupted = Instance.objects.get(pk=drill.instance_id)
        found["steps_lost"] = max(0, interrupted.last_step - (resume.step if resume else 0))
    return found, notice, save


def _window_s(notice: InterruptionEvent | None) -> float | None:
    """The notice save's window: the notice's own deadline, else the default budget."""
    if notice is None:
        return None
    if notice.deadline and notice.notice_time:
        return max(0.0, (notice.deadline - notice.notice_time).total_seconds())
    return float(settings.RESPAWN["NOTICE_BUDGET_S"])


def _verdict(drill: Drill, found: dict, notice: InterruptionEvent | None,
             save: Checkpoint | None) -> tuple[bool, str] | None:
    """(passed, cause) once the outcome is known; None while the recovery goes on."""
    job_status = Job.objects.filter(pk=drill.job_id).values_list("status", flat=True).first()
    if found["training_again_at"] is None:
        if job_status in JobStatus.TERMINAL:
            if job_status == JobStatus.SUCCEEDED:
                return True, ""  # the drill came in its last steps: the job finished from its save
            return False, f"the job ended {job_status} before it trained again"
        return None
    if not drill.with_notice:
        return True, ""  # a hard reclaim: the recovery is the test; steps_lost says what it cost
    if found["notice_seen_at"] is None:
        return False, "no notice was seen: the agent never reported the cloud's notice (check the notice source)"
    cause = _save_cause(found, notice, save)
    return (not cause), cause


def _save_cause(found: dict, notice: InterruptionEvent, save: Checkpoint | None) -> str:
    """Why the notice save failed its window ('' when it met it)."""
    window = found["window_s"]
    if save is None:
        return (f"no notice save was committed within the {window:.0f} s window: {found['steps_lost'] or 0} step(s) "
                "since the newest checkpoint were lost")
    start = notice.notice_time or notice.received_at
    took = (save.committed_at - start).total_seconds()
    if notice.checkpoint_saved is not False and took <= window:
        return ""
    rate = f" at {save.bytes / GB / save.save_s:.1f} GB/s" if save.save_s else ""
    return (f"notice save missed the {window:.0f} s window by {took - window:.0f} s: checkpoint of "
            f"{save.bytes / GB:.1f} GB{rate}")


def seconds_after(drill: Drill, moment: datetime | None) -> float | None:
    return None if moment is None or drill.interrupted_at is None else round(
        (moment - drill.interrupted_at).total_seconds(), 1)


def as_report(drill: Drill) -> dict:
    """The report the API, the CLI's --json and the job page show."""
    return {
        "id": drill.pk, "job": drill.job_id, "instance": drill.instance_id, "rank": drill.rank,
        "with_notice": drill.with_notice, "requested_by": drill.requested_by.get_username(),
        "status": drill.status, "requested_at": drill.requested_at, "interrupted_at": drill.interrupted_at,
        **{name.removesuffix("_at") + "_after_s": seconds_after(drill, getattr(drill, name)) for name in PHASES},
        "steps_lost": drill.steps_lost, "window_s": drill.window_s,
        "passed": {DrillStatus.PASSED: True, DrillStatus.FAILED: False}.get(drill.status),
        "cause": drill.cause, "missing_permission": drill.missing_permission, "finished_at": drill.finished_at,
    }


