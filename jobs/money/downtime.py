"""Where each interruption's minutes went: the time from the interruption (the later of
its notice and the VM's last step, as its heartbeats tell it: a VM may train on through
its notice while its spare boots) to the first heartbeat of the replacement reporting a
step past its resume step, split into parts, from timestamps the control plane already
records (docs/downtime.md).

The parts follow the path a recovery takes, each ending at a mark:

- save: until the notice checkpoint was committed (none: no part);
- capacity: until a replacement VM was requested (the old VM's end, then placement);
- boot: until the replacement's agent registered (image, agent, code, data);
- validation: until the control plane's verdict on the resume checkpoint, when the
  replacement had registered before it (the trainer validates a pending one first);
- restore: until the replacement reported its first step past the resume step.

An elastic gang that went on without a lost node (docs/elastic.md) requested and
booted nothing: its capacity and boot parts are zero, and its restore runs from the
regroup to the first step a survivor reported since (its steps redone from the checkpoint
included: a node's steps are recorded once).

A mark earlier than the one before it (a replacement requested while the old VM still
saves) is clamped to it, so that part is zero: only time on the path to the resumed
training counts, and the parts always add up to the downtime. While an interruption
is still open, the part it is in runs to `now`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db.models import Min, Q

from respawn.protocol import CheckpointKind, Purpose
from respawn_server.jobs.core.choices import InterruptionKind
from respawn_server.jobs.models import Checkpoint, Instance, MetricPoint, StepPoint, WorldSize

PARTS = ("save", "capacity", "boot", "validation", "restore")
# Marks a recovery must pass; a missing one means the recovery is still in that part.
REQUIRED = frozenset({"capacity", "boot", "restore"})
INTERRUPTING = (InterruptionKind.NOTICE, InterruptionKind.PREEMPTED, InterruptionKind.LOST)


@dataclass(frozen=True, slots=True)
class Timeline:
    """One interruption's recorded moments (None: not happened or not known)."""

    instance_id: int
    kind: str
    interrupted: dt.datetime
    saved: dt.datetime | None = None
    requested: dt.datetime | None = None
    registered: dt.datetime | None = None
    validated: dt.datetime | None = None
    resumed: dt.datetime | None = None
    replacement_id: int | None = None


@dataclass(frozen=True, slots=True)
class Downtime:
    instance_id: int
    replacement_id: int | None
    kind: str
    interrupted: dt.datetime
    resumed: dt.datetime | None
    parts: dict[str, float]

    @property
    def total_s(self) -> float:
        return sum(self.parts.values())

    @property
    def ongoing(self) -> bool:
        return self.resumed is None


def split(timeline: Timeline, now: dt.datetime) -> Downtime:
    """The parts of one interruption's downtime, in seconds (see the module's doc)."""
    end = max(timeline.resumed or now, timeline.interrupted)
    validated = timeline.validated
    if validated is not None and (timeline.registered is None or not timeline.registered < validated <= end):
        validated = None  # judged before the replacement asked, or after it trained: nobody waited on it
    marks = {"save": timeline.saved, "capacity": timeline.requested, "boot": timeline.registered,
             "validation": validated, "restore": timeline.resumed}
    parts = dict.fromkeys(PARTS, 0.0)
    previous = timeline.interrupted
    for name in PARTS:
        at = marks[name]
        if at is None:
            if name not in REQUIRED:
                continue
            at = end  # the recovery is in this part now
        at = min(max(at, previous), end)
        parts[name] = (at - previous).total_seconds()
        previous = at
        if previous == end:
            break
    return Downtime(instance_id=timeline.instance_id, replacement_id=timeline.replacement_id, kind=timeline.kind,
                    interrupted=timeline.interrupted, resumed=timeline.resumed, parts=parts)


def total_s(downtimes: list[Downtime], now: dt.datetime) -> float:
    """Seconds the job was down: the union of its interruptions' spans (in a gang two
    nodes' interruptions may overlap, and one second down is counted once)."""
    spans = sorted((d.interrupted, d.resumed or now) for d in downtimes)
    total, reach = 0.0, None
    for start, end in spans:
        if reach is not None and start < reach:
            start = reach
        if end > start:
            total += (end - start).total_seconds()
        reach = end if reach is None else max(reach, end)
    return total


def timelines(job_id: int) -> list[Timeline]:
    """Each interrupted training VM of the job, with the moments of its recovery: the
    first VM requested for its node slot after it, and the first of those that trained. A
    spare or joiner lost before it trained interrupted nothing."""
    interrupted = (Instance.objects.filter(job_id=job_id, purpose=Purpose.TRAIN, interruptions__kind__in=INTERRUPTING)
                   .annotate(noticed=Min("interruptions__notice_time",
                                         filter=Q(interruptions__kind=InterruptionKind.NOTICE)),
                             notice_received=Min("interruptions__received_at",
                                                 filter=Q(interruptions__kind=InterruptionKind.NOTICE)),
                             first_event=Min("interruptions__received_at"))
                   .filter(standby_for__isnull=True, joining=False).order_by("pk").distinct())
    found = []
    for old in interrupted:
        noticed = old.noticed or old.notice_received
        # Its last step: a VM that trained on through its notice (while its spare booted) was down only after it.
        last_step_at = MetricPoint.objects.filter(instance=old).order_by("-step", "time").values_list(
            "time", flat=True).first()
        at = max(filter(None, (noticed, last_step_at)), default=None) or old.ended_at or old.first_event
        saved = None
        if noticed is not None:  # its notice's save: in a gang rank 0 commits it, and before the VM has ended
            saves = Checkpoint.objects.filter(job_id=job_id, kind=CheckpointKind.NOTICE, committed_at__gte=noticed)
            if old.ended_at is not None:
                saves = saves.filter(committed_at__lte=old.ended_at)
            saved = saves.order_by("committed_at").values_list("committed_at", flat=True).first()
        regroup = WorldSize.objects.filter(after_instance=old).select_related("resume_checkpoint").first()
        if regroup is not None:
            found.append(_went_on_without(old, at, regroup))
            continue
        after = Instance.objects.filter(job_id=job_id, rank=old.rank, purpose=Purpose.TRAIN, joining=False,
                                        pk__gt=old.pk).order_by("pk")
        first = after.first()
        trained = _first_training(after)
        replacement = trained[0] if trained else (first if first and first.registered_at else None)
        found.append(Timeline(
            instance_id=old.pk, kind=InterruptionKind.NOTICE if noticed else _end_kind(old), interrupted=at,
            saved=saved, requested=first.requested_at if first else None,
            registered=replacement.registered_at if replacement else None,
            validated=(replacement.resume_checkpoint.validated_at
                       if replacement and replacement.resume_checkpoint else None),
            resumed=trained[1] if trained else None, replacement_id=replacement.pk if replacement else None))
    return found


def _went_on_without(old: Instance, interrupted: dt.datetime, regroup: WorldSize) -> Timeline:
    """An elastic gang went on without the node on the VMs it had (recovery.elastic.regroup):
    nothing was requested or booted (those marks are the regroup's moment), and it
    resumed at the first step a node's trainer reported since (StepPoint; a node's steps
    are kept once, so that is its first step past where it was before: the steps redone
    from the checkpoint count as restore); a trainer that reports no steps, at the first
    heartbeat past the resume step."""
    resume_step = regroup.resume_checkpoint.step if regroup.resume_checkpoint else 0
    after = {"job_id": old.job_id, "time__gt": regroup.at}
    resumed = (StepPoint.objects.filter(**after).aggregate(at=Min("time"))["at"]
               or MetricPoint.objects.filter(**after, step__gt=resume_step).exclude(instance=old).aggregate(
                   at=Min("time"))["at"])
    return Timeline(instance_id=old.pk, kind=_end_kind(old), interrupted=interrupted, requested=regroup.at,
                    registered=regroup.at, resumed=resumed)


def _first_training(instances) -> tuple[Instance, dt.datetime] | None:
    """The first of `instances` with a heartbeat past its resume step, and that heartbeat's time."""
    for instance in instances.select_related("resume_checkpoint"):
        resume_step = instance.resume_checkpoint.step if instance.resume_checkpoint else 0
        at = MetricPoint.objects.filter(instance=instance, step__gt=resume_step).aggregate(at=Min("time"))["at"]
        if at is not None:
            return instance, at
    return None


def _end_kind(instance: Instance) -> str:
    return InterruptionKind.LOST if instance.interruptions.filter(kind=InterruptionKind.LOST).exists() \
        else InterruptionKind.PREEMPTED


def job_downtime(job_id: int, now: dt.datetime) -> tuple[float, list[Downtime]]:
    """The job's total downtime in seconds and each interruption's parts."""
    downtimes = [split(t, now) for t in timelines(job_id)]
    return total_s(downtimes, now), downtimes
