"""A drill's report: each phase of the recovery as the control plane saw it, measured from
the moment the cloud accepted the interruption, and the verdict against the job's notice
window with the cause of a failure named.

Derived each time it is read from the job's own rows (notices, checkpoints, instances,
metrics), never stored: a row recorded later (a checkpoint validated after the report was
first read, a replacement's late registration) shows in the next read. A drill row keeps
only what happened to the request itself (requested, sent, refused and why)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db.models import Max, Q

from respawn_server.jobs.core.choices import CheckpointKind, DrillStatus, InterruptionKind, JobStatus, ValidationResult
from respawn_server.jobs.models import Checkpoint, Drill, Instance, InterruptionEvent, Job, MetricPoint

PHASES = ("notice_seen_at", "save_committed_at", "replacement_requested_at", "replacement_booted_at", "validated_at",
          "training_again_at")
GB = 1e9


@dataclass(frozen=True, kw_only=True, slots=True)
class Recovery:
    """What followed a sent drill, from the rows as they are now."""

    notice_seen_at: datetime | None = None
    save_committed_at: datetime | None = None
    replacement_requested_at: datetime | None = None
    replacement_booted_at: datetime | None = None
    validated_at: datetime | None = None
    training_again_at: datetime | None = None
    steps_lost: int | None = None
    window_s: float | None = None
    status: str = DrillStatus.SENT
    """DrillStatus.SENT while the recovery goes on, else PASSED or FAILED."""
    cause: str = ""
    finished_at: datetime | None = None
    """When the verdict became known: training again, or the job's end."""


def recovery(drill: Drill) -> Recovery:
    """The drill's recovery as the rows tell it now; a drill not sent has none (an empty one
    with the drill's own status)."""
    if drill.status != DrillStatus.SENT or drill.interrupted_at is None:
        return Recovery(status=drill.status, cause=drill.cause, finished_at=drill.finished_at)
    found, notice, save = _phases(drill)
    status, cause, finished_at = _verdict(drill, found, notice, save)
    return Recovery(**found, status=status, cause=cause, finished_at=finished_at)


def is_open(drill: Drill) -> bool:
    """Whether the drill is still in flight: not yet sent, or sent and not yet judged."""
    return drill.status in DrillStatus.OPEN and recovery(drill).status in DrillStatus.OPEN


def _phases(drill: Drill) -> tuple[dict, InterruptionEvent | None, Checkpoint | None]:
    """The phases' moments and figures, with the notice and the notice save they came from."""
    since = drill.interrupted_at
    notice = InterruptionEvent.objects.filter(instance=drill.instance_id, kind=InterruptionKind.NOTICE,
                                              received_at__gte=since).order_by("received_at").first()
    save = Checkpoint.objects.filter(job=drill.job_id, kind=CheckpointKind.NOTICE,
                                     committed_at__gte=since).order_by("committed_at").first()
    replacement = Instance.objects.filter(job=drill.job_id, rank=drill.rank, requested_at__gte=since).exclude(
        pk=drill.instance_id).select_related("resume_checkpoint").order_by("requested_at", "pk").first()
    found = {
        "notice_seen_at": notice.received_at if notice else None,
        "save_committed_at": save.committed_at if save else None,
        "replacement_requested_at": replacement.requested_at if replacement else None,
        "replacement_booted_at": replacement.registered_at if replacement else None,
        "window_s": _window_s(notice),
    }
    if replacement is not None and replacement.registered_at is not None:
        resume = replacement.resume_checkpoint
        resume_step = resume.step if resume else 0
        if resume is not None and resume.validation == ValidationResult.VALID:
            found["validated_at"] = resume.validated_at
        # A gang trains again as one, and reports its steps through rank 0: any node launched
        # since the drill past the resume step, and the furthest step of the nodes it interrupted.
        first = MetricPoint.objects.filter(job=drill.job_id, instance__requested_at__gte=since,
                                           step__gt=resume_step).order_by("time").first()
        found["training_again_at"] = first.time if first else None
        reached = Instance.objects.filter(job=drill.job_id, requested_at__lt=since).filter(
            Q(ended_at__isnull=True) | Q(ended_at__gte=since)).aggregate(step=Max("last_step"))["step"] or 0
        found["steps_lost"] = max(0, reached - resume_step)
    return found, notice, save


def _window_s(notice: InterruptionEvent | None) -> float | None:
    """The notice save's window: the notice's own deadline, else the default budget."""
    if notice is None:
        return None
    if notice.deadline and notice.notice_time:
        return max(0.0, (notice.deadline - notice.notice_time).total_seconds())
    return float(settings.RESPAWN["NOTICE_BUDGET_S"])


def _verdict(drill: Drill, found: dict, notice: InterruptionEvent | None,
             save: Checkpoint | None) -> tuple[str, str, datetime | None]:
    """(status, cause, when judged): SENT with no cause while the recovery goes on."""
    training_again = found.get("training_again_at")
    if training_again is None:
        job_status, job_finished = Job.objects.filter(pk=drill.job_id).values_list("status", "finished_at").get()
        if job_status == JobStatus.SUCCEEDED:
            return DrillStatus.PASSED, "", job_finished  # the drill came in its last steps: finished from its save
        if job_status in JobStatus.TERMINAL:
            return DrillStatus.FAILED, f"the job ended {job_status} before it trained again", job_finished
        return DrillStatus.SENT, "", None
    if not drill.with_notice:
        cause = ""  # a hard reclaim: the recovery is the test; steps_lost says what it cost
    elif found["notice_seen_at"] is None:
        cause = "no notice was seen: the agent never reported the cloud's notice (check the notice source)"
    else:
        cause = _save_cause(found, notice, save)
    return (DrillStatus.FAILED if cause else DrillStatus.PASSED), cause, training_again


def _save_cause(found: dict, notice: InterruptionEvent, save: Checkpoint | None) -> str:
    """Why the notice save failed its window ('' when it met it)."""
    window = found["window_s"]
    if save is None:
        return (f"no notice save was committed within the {window:.0f} s window: {found.get('steps_lost') or 0} "
                "step(s) since the newest checkpoint were lost")
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
    """The report the API, the CLI's --json and the job page show, derived now."""
    found = recovery(drill)
    return {
        "id": drill.pk, "job": drill.job_id, "instance": drill.instance_id, "rank": drill.rank,
        "with_notice": drill.with_notice, "requested_by": drill.requested_by.get_username(),
        "status": found.status, "requested_at": drill.requested_at, "interrupted_at": drill.interrupted_at,
        **{name.removesuffix("_at") + "_after_s": seconds_after(drill, getattr(found, name)) for name in PHASES},
        "steps_lost": found.steps_lost, "window_s": found.window_s,
        "passed": {DrillStatus.PASSED: True, DrillStatus.FAILED: False}.get(found.status),
        "cause": found.cause, "missing_permission": drill.missing_permission, "finished_at": found.finished_at,
    }

