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

from django.db import connection
from django.db.models import Min

from respawn.protocol import CheckpointKind, Purpose
from respawn_server.jobs.core.choices import InterruptionKind
from respawn_server.jobs.models import Checkpoint, Instance, InterruptionEvent, MetricPoint, StepPoint, WorldSize

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
    resume_step: int | None = None
    resume_tier: str = ""  # "storage" or "memory" (docs/memory-tier.md); "": from the start, or nothing resumed yet


@dataclass(frozen=True, slots=True)
class Downtime:
    instance_id: int
    replacement_id: int | None
    kind: str
    interrupted: dt.datetime
    resumed: dt.datetime | None
    parts: dict[str, float]
    resume_step: int | None = None
    """The step the node slot's work went on from, and the tier that held it: the work
    after it that the interrupted VM had done was lost."""
    resume_tier: str = ""

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
                    interrupted=timeline.interrupted, resumed=timeline.resumed, parts=parts,
                    resume_step=timeline.resume_step, resume_tier=timeline.resume_tier)


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


INSTANCE, CHECKPOINT, INTERRUPTION = Instance._meta.db_table, Checkpoint._meta.db_table, InterruptionEvent._meta.db_table
METRIC, WORLD_SIZE = MetricPoint._meta.db_table, WorldSize._meta.db_table


def reads(job_id: int) -> list[tuple[str, list]]:
    """The SELECTs (SQL, params) whose rows `from_rows` makes the job's timelines of: a
    fixed number however many times the job was interrupted (the job page sends them in
    its one round trip, respawn_server.frontend.reads.batch). Per training VM: its node
    slot, its resume checkpoint's step, its moments and that checkpoint's verdict, the time of its last
    step (a VM that trained on through its notice, while its spare booted, was down only
    after it) and of its first heartbeat past its resume step."""
    train = [job_id, Purpose.TRAIN]
    return [
        (f"SELECT i.id, i.rank, i.joining, i.standby_for_id, COALESCE(i.memory_resume_step, c.step), "
         f"i.memory_resume_step IS NOT NULL, i.requested_at, i.registered_at, i.ended_at, "
         f"c.validated_at, (SELECT m.time FROM {METRIC} m WHERE m.instance_id = i.id ORDER BY m.step DESC, m.time "
         f"LIMIT 1), (SELECT MIN(m.time) FROM {METRIC} m WHERE m.instance_id = i.id "
         f"AND m.step > COALESCE(i.memory_resume_step, c.step, 0)) "
         f"FROM {INSTANCE} i LEFT JOIN {CHECKPOINT} c ON c.id = i.resume_checkpoint_id "
         "WHERE i.job_id = %s AND i.purpose = %s ORDER BY i.id", train),
        (f"SELECT e.instance_id, e.kind, e.notice_time, e.received_at FROM {INTERRUPTION} e "
         f"JOIN {INSTANCE} i ON i.id = e.instance_id WHERE i.job_id = %s AND i.purpose = %s "
         f"AND e.kind IN ({', '.join(['%s'] * len(INTERRUPTING))})", [*train, *INTERRUPTING]),
        (f"SELECT committed_at FROM {CHECKPOINT} WHERE job_id = %s AND kind = %s ORDER BY committed_at",
         [job_id, CheckpointKind.NOTICE]),
        (f"SELECT after_instance_id, id FROM {WORLD_SIZE} WHERE job_id = %s AND after_instance_id IS NOT NULL "
         "ORDER BY at, id", [job_id]),
    ]


def _moment(value) -> dt.datetime | None:
    """A timestamp as an aware datetime: SQLite hands back a column naive and a
    subquery's value as text."""
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    return value.replace(tzinfo=dt.UTC) if value is not None and value.tzinfo is None else value


@dataclass(frozen=True, slots=True)
class _Vm:
    pk: int
    rank: int
    joining: bool
    standby_for: int | None
    resume_step: int | None  # the memory tier's step where it resumed from there (a spare handed the state)
    from_memory: bool
    requested_at: dt.datetime | None
    registered_at: dt.datetime | None
    ended_at: dt.datetime | None
    resume_validated_at: dt.datetime | None
    last_step_at: dt.datetime | None
    trained_at: dt.datetime | None


def from_rows(vms: list[tuple], events: list[tuple], saves: list[tuple], regroups: list[tuple]) -> list[Timeline]:
    """Each interrupted training VM of the job, with the moments of its recovery: the
    first VM requested for its node slot after it, and the first of those that trained. A
    spare or joiner lost before it trained interrupted nothing. The rows are `reads`'s."""
    vms = [_Vm(pk, rank, bool(joining), standby, resume_step, bool(from_memory), *map(_moment, moments))
           for pk, rank, joining, standby, resume_step, from_memory, *moments in vms]
    kinds: dict[int, list[tuple]] = {}
    for instance_id, kind, notice_time, received_at in events:
        kinds.setdefault(instance_id, []).append((kind, _moment(notice_time), _moment(received_at)))
    saves = [_moment(committed) for (committed,) in saves]
    regrouped = {}
    for instance_id, pk in regroups:
        regrouped.setdefault(instance_id, pk)
    found = []
    for old in vms:
        if old.pk not in kinds or old.standby_for is not None or old.joining:
            continue
        noticed = _first(t for kind, t, _ in kinds[old.pk] if kind == InterruptionKind.NOTICE) or _first(
            t for kind, _, t in kinds[old.pk] if kind == InterruptionKind.NOTICE)
        at = (max(filter(None, (noticed, old.last_step_at)), default=None) or old.ended_at
              or _first(t for _, _, t in kinds[old.pk]))
        saved = None
        if noticed is not None:  # its notice's save: in a gang rank 0 commits it, and before the VM has ended
            saved = _first(t for t in saves if t >= noticed and (old.ended_at is None or t <= old.ended_at))
        ended = (InterruptionKind.LOST if any(k == InterruptionKind.LOST for k, _, _ in kinds[old.pk])
                 else InterruptionKind.PREEMPTED)
        if old.pk in regrouped:
            found.append(_went_on_without(old, ended, at, WorldSize.objects.select_related("resume_checkpoint").get(
                pk=regrouped[old.pk])))
            continue
        after = [vm for vm in vms if vm.rank == old.rank and not vm.joining and vm.pk > old.pk]
        first = after[0] if after else None
        trained = next((vm for vm in after if vm.trained_at is not None), None)
        replacement = trained or (first if first and first.registered_at else None)
        found.append(Timeline(
            instance_id=old.pk, kind=InterruptionKind.NOTICE if noticed else ended, interrupted=at, saved=saved,
            requested=first.requested_at if first else None,
            registered=replacement.registered_at if replacement else None,
            validated=replacement.resume_validated_at if replacement else None,
            resumed=trained.trained_at if trained else None, replacement_id=replacement.pk if replacement else None,
            resume_step=(replacement.resume_step or 0) if replacement else None,
            resume_tier=("memory" if replacement.from_memory else "storage")
            if replacement and replacement.resume_step is not None else ""))
    return found


def _first(moments) -> dt.datetime | None:
    return min(filter(None, moments), default=None)


def timelines(job_id: int) -> list[Timeline]:
    """`from_rows` of the job's rows as they are now."""
    found = []
    with connection.cursor() as cursor:
        for sql, params in reads(job_id):
            cursor.execute(sql, params)
            found.append(cursor.fetchall())
    return from_rows(*found)


def _went_on_without(old: _Vm, kind: str, interrupted: dt.datetime, regroup: WorldSize) -> Timeline:
    """An elastic gang went on without the node on the VMs it had (recovery.elastic.regroup):
    nothing was requested or booted (those marks are the regroup's moment), and it
    resumed at the first step a node's trainer reported since (StepPoint; a node's steps
    are kept once, so that is its first step past where it was before: the steps redone
    from the checkpoint count as restore); a trainer that reports no steps, at the first
    heartbeat past the resume step."""
    resume_step = regroup.resume_step or 0
    after = {"job_id": regroup.job_id, "time__gt": regroup.at}
    resumed = (StepPoint.objects.filter(**after).aggregate(at=Min("time"))["at"]
               or MetricPoint.objects.filter(**after, step__gt=resume_step).exclude(instance=old.pk).aggregate(
                   at=Min("time"))["at"])
    return Timeline(instance_id=old.pk, kind=kind, interrupted=interrupted, requested=regroup.at,
                    registered=regroup.at, resumed=resumed, resume_step=resume_step, resume_tier=regroup.resume_tier)


def job_downtime(job_id: int, now: dt.datetime, rows: list[list[tuple]] | None = None) -> tuple[float, list[Downtime]]:
    """The job's total downtime in seconds and each interruption's parts (from `rows`,
    the answers to `reads`, when the caller read them already)."""
    downtimes = [split(t, now) for t in (from_rows(*rows) if rows is not None else timelines(job_id))]
    return total_s(downtimes, now), downtimes
