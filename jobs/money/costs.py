"""Money from the database (DESIGN §8): rows → `respawn_server.jobs.money.ledger` inputs → per job,
per team, per UTC month.

The ledger itself is pure (`respawn_server.jobs.money.ledger`); this module only decides what each
instance's interval and work were, from what the control plane recorded:

- Billing starts when the launch was fulfilled: the instance's move to `booting`
  (its InstanceEvent), else its registration; an instance that never got a VM
  (still `requested`, or a capacity error before launch) is never billed.
  Billing ends at `ended_at`, or now while it lives.
- Seconds per step are measured on the instance from its MetricPoints past its
  resume step (an agent heartbeats before its trainer has loaded the checkpoint);
  an instance with too few such points borrows the mean of its job's measured
  instances.
- Kept steps follow the chain of checkpoints resumed from, per node slot: the
  newest instance keeps what it did past its resume step; the instance that wrote
  that checkpoint keeps what it did between its own resume step and the
  checkpoint's step, and so on back. Work past a resumed checkpoint was lost.
- Recomputed steps: what an instance ran again that an earlier instance of the
  same slot had already reached.
- Boot/restore: billed time until its trainer was at work: up to the last
  heartbeat before the first one past its resume step (all of it while there is
  none). Checkpoint stalls: Σ Checkpoint.stall_s.
- A drill's runs (`ledger.Drill`): per node slot, the first instance launched after a
  drill's interruption recovers from it (the spare or relaunch of the node drilled, and
  of the rest of its gang, which hands over whole); its boot/restore and recomputed
  steps are the drill's money, shown apart from spot's.
- A stopped disk: an instance that ended preempted with a disk its cloud keeps
  (`Instance.DISK_KEPT`: an Azure spot VM evicted with policy Deallocate) bills that
  disk from `ended_at` until `storage_released_at` (the reconciler saw the VM
  deleted), or up to now while it is not.

A team's month is the sum of its jobs' months (each job's ledger reports its own
share of the month), so the jobs of a month add up to the team's figure.

Every function here issues a fixed number of queries whatever the number of
jobs, instances or metric points, so list pages stay flat.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal
from functools import cache, reduce
from operator import or_

from django.db import connection
from django.db.models import Case, Count, Exists, F, Max, Min, OuterRef, Q, Sum, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from respawn_server.jobs.core.choices import DrillStatus, EndReason, InstanceState, InterruptionKind
from respawn_server.jobs.core.drilled import not_drilled
from respawn_server.jobs.models import (RESUME_STEP, RESUMED_FROM_WRITER, Checkpoint, DiskPriceQuote, Drill, Instance,
                                        InstanceEvent, InterruptionEvent, Job, MetricPoint, PriceQuote, WorldSize)
from respawn_server.jobs.money import ledger
from respawn_server.jobs.money.prices import DiskQuote, Quote

MONTH_RE = re.compile(r"(\d{4})-(\d{2})", re.ASCII)
# Months a deployment can have billed in; outside them the arithmetic on a month's
# bounds (and on the months beside it) would leave the calendar datetime knows.
FIRST_MONTH, LAST_MONTH = (1970, 1), (9998, 12)
RECENT_INSTANCES = 4  # looked at for a job's current speed: a gang's ranks, or a replacement and its predecessor


class CostError(ValueError):
    """A request the ledger cannot answer; the message names what is wrong."""


@dataclass(frozen=True, kw_only=True, slots=True)
class InstanceWork:
    """What the ledger was told about one instance, for display beside its money."""

    instance_id: int
    job_id: int
    rank: int
    billed_from: dt.datetime
    billed_to: dt.datetime | None
    resume_step: int
    last_step: int
    steps_kept: int
    recomputed_steps: int
    seconds_per_step: Decimal
    boot_restore_seconds: Decimal
    checkpoint_stall_seconds: Decimal
    stopped_disk: str = ""
    """Price SKU of the disk billed after its end ("" when none)."""
    disk_released: dt.datetime | None = None
    drill: bool = False
    """It recovers from a drill: its boot/restore and recomputed steps are the drill's."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobCost:
    job_id: int
    ledger: ledger.Ledger
    work: dict[int, InstanceWork]
    now: dt.datetime


def parse_month(text: str | None, now: dt.datetime) -> tuple[str, dt.datetime, dt.datetime]:
    """'YYYY-MM' (or None for the current UTC month) -> (label, first instant, first instant of next)."""
    if text is None or text == "":
        now = now.astimezone(dt.UTC)
        year, month = now.year, now.month
    else:
        match = MONTH_RE.fullmatch(text)
        if not match or not 1 <= int(match.group(2)) <= 12:
            raise CostError(f"month must look like YYYY-MM, e.g. 2026-11 (got {text!r})")
        year, month = int(match.group(1)), int(match.group(2))
        if not FIRST_MONTH <= (year, month) <= LAST_MONTH:
            raise CostError(f"month must be between {FIRST_MONTH[0]}-{FIRST_MONTH[1]:02d} and "
                            f"{LAST_MONTH[0]}-{LAST_MONTH[1]:02d} (got {text!r})")
    start = dt.datetime(year, month, 1, tzinfo=dt.UTC)
    end = dt.datetime(year + month // 12, month % 12 + 1, 1, tzinfo=dt.UTC)
    return f"{year:04d}-{month:02d}", start, end


# ---- rows -> ledger inputs ------------------------------------------------------------------

def _billing_starts(instances) -> dict[int, dt.datetime]:
    launched = dict(
        InstanceEvent.objects.filter(instance_id__in=[i.pk for i in instances], to_state=InstanceState.BOOTING)
        .values("instance_id").annotate(at=Min("created_at")).values_list("instance_id", "at")
    )
    starts = {}
    for instance in instances:
        start = launched.get(instance.pk) or instance.registered_at or instance.running_at
        if start is not None:
            starts[instance.pk] = start
    return starts


@dataclass(frozen=True, slots=True)
class _Measured:
    restored: dt.datetime | None
    """The last heartbeat before its trainer reported a step past the resume step (the
    first heartbeat when there was none); None while it has not reported one."""
    seconds_per_step: Decimal | None


def _measurements(instance_ids, first_resume: dict[int, int] | None = None) -> dict[int, _Measured]:
    """What each instance's heartbeats say about its restore and its speed. An agent
    heartbeats before its trainer has loaded the checkpoint (reporting step 0, or the
    resume step): that wait is restore time, and the speed is measured only over the
    heartbeats past the resume step, the steps this instance really ran. `first_resume`:
    the resume step of an instance's first run where it is not its resume checkpoint's
    (a regrouped node of an elastic gang; few, one query each)."""
    first_resume = first_resume or {}
    training = Q(step__gt=Coalesce(F("instance__resume_checkpoint__step"), 0))
    rows = list(MetricPoint.objects.filter(instance_id__in=[pk for pk in instance_ids if pk not in first_resume])
                .values("instance_id").annotate(waited=Max("time", filter=~training), t0=Min("time", filter=training),
                                                t1=Max("time", filter=training), s0=Min("step", filter=training),
                                                s1=Max("step", filter=training)))
    for pk, step in first_resume.items():
        training = Q(step__gt=step)
        rows += MetricPoint.objects.filter(instance_id=pk).values("instance_id").annotate(
            waited=Max("time", filter=~training), t0=Min("time", filter=training), t1=Max("time", filter=training),
            s0=Min("step", filter=training), s1=Max("step", filter=training))
    measured = {}
    for row in rows:
        rate = None
        if row["t0"] is not None and row["s1"] > row["s0"]:
            seconds = Decimal((row["t1"] - row["t0"]).total_seconds())
            rate = (seconds / (row["s1"] - row["s0"])).quantize(Decimal("0.000001"))
        restored = (row["waited"] or row["t0"]) if row["t0"] is not None else None
        measured[row["instance_id"]] = _Measured(restored, rate)
    return measured


def seconds_per_step(job_id: int) -> Decimal | None:
    """The job's speed now: its newest measured instance's (a replacement that has not
    trained yet is not measured, so the one before it speaks for the job)."""
    recent = list(Instance.objects.filter(job_id=job_id).order_by("-requested_at", "-pk")
                  .values_list("pk", flat=True)[:RECENT_INSTANCES])
    measured = _measurements(recent)
    return next((m.seconds_per_step for pk in recent
                 if (m := measured.get(pk)) is not None and m.seconds_per_step is not None), None)


def _stalls(instance_ids) -> dict[int, Decimal]:
    rows = (Checkpoint.objects.filter(instance_id__in=instance_ids, stall_s__isnull=False)
            .values("instance_id").annotate(total=Sum("stall_s")).values_list("instance_id", "total"))
    return {pk: Decimal(str(total)) for pk, total in rows}


def kept_and_recomputed(slot) -> dict[int, tuple[int, int]]:
    """(steps kept, steps recomputed) of each run of one node slot, in launch order.

    A run is anything with `pk`, `resume_step`, `resume_from` (the id of the
    instance that wrote the checkpoint it resumed from, or None) and `last_step`.
    Kept work is found by walking back from the newest run along the checkpoints
    resumed from; where the writer is not in this slot (a gang's checkpoint
    reported by another rank), the latest earlier run of the slot that reached
    the resume step is taken as its origin."""
    result = {run.pk: [0, 0] for run in slot}
    reached = 0
    for run in slot:
        result[run.pk][1] = max(0, min(run.last_step, reached) - run.resume_step)
        reached = max(reached, run.last_step)
    position = {run.pk: i for i, run in enumerate(slot)}
    i, top = len(slot) - 1, slot[-1].last_step if slot else 0
    while i >= 0:
        run = slot[i]
        result[run.pk][0] = max(0, top - run.resume_step)
        if run.resume_from is None and run.resume_step == 0:
            break
        top = run.resume_step
        origin = position.get(run.resume_from)
        if origin is None or origin >= i:
            origin = next((j for j in range(i - 1, -1, -1)
                           if slot[j].resume_step < top <= slot[j].last_step), None)
        if origin is None:
            break
        i = origin
    return {pk: (kept, redone) for pk, (kept, redone) in result.items()}


@dataclass(frozen=True, slots=True)
class _Run:
    """A run of a node slot, as kept_and_recomputed reads it: an instance's training in
    one slot, which an elastic gang's regroup ends and starts anew in another."""

    pk: int | tuple[int, int]
    job_id: int
    rank: int
    resume_step: int
    resume_from: int | None
    last_step: int
    kept_until: int | None = None  # a run the gang went on without: the step the gang resumed from


def _lineages(slot: list[_Run]) -> list[list[_Run]]:
    """The slot's runs cut after a run the gang went on without (its kept_until set) where
    the next resumed past that run's kept_until: the gang's work from there on was other
    runs', whatever step this one's heartbeats had reached (the slot stood empty between
    them). A relaunch's resume past its predecessor's last heartbeat is no cut: the
    checkpoint it resumed from is that run's."""
    lineages: list[list[_Run]] = []
    for run in slot:
        before = lineages[-1][-1] if lineages else None
        if before is None or before.kept_until is not None and run.resume_step > before.kept_until:
            lineages.append([])
        lineages[-1].append(run)
    return lineages


def _runs(instance: Instance, start: dt.datetime) -> list[tuple[dt.datetime, int, int, _Run]]:
    """(start, instance, n, run) of each run of the instance, in launch order: its earlier
    runs (Instance.earlier_runs), each keyed (pk, n), then its run now, keyed by its pk
    (the key a checkpoint's writer has)."""
    runs = []
    for n, ran in enumerate(instance.earlier_runs):
        runs.append((start, instance.pk, n, _Run((instance.pk, n), instance.job_id, ran["rank"], ran["resume_step"],
                                                 ran["resume_from"], ran["last_step"], ran["kept_until"])))
        start = dt.datetime.fromisoformat(ran["until"])
    return [*runs, (start, instance.pk, len(runs), _Run(instance.pk, instance.job_id, instance.rank,
                                                        instance.resume_step, instance.resume_from, instance.last_step))]


def _drill_runs(instances) -> set[int]:
    """The instances that recover from a drill: per node slot, the first launched after a
    drill's interruption (one query)."""
    drills = defaultdict(list)
    for job_id, interrupted_at in Drill.objects.filter(
            job_id__in={i.job_id for i in instances}, status__in=DrillStatus.INTERRUPTING,
            interrupted_at__isnull=False).values_list("job_id", "interrupted_at"):
        drills[job_id].append(interrupted_at)
    slots = defaultdict(list)
    for instance in instances:
        if instance.job_id in drills:
            slots[(instance.job_id, instance.rank)].append(instance)
    runs = set()
    for (job_id, _), slot in slots.items():
        for moment in drills[job_id]:
            after = [i for i in slot if i.requested_at >= moment]
            if after:
                runs.add(min(after, key=lambda i: (i.requested_at, i.pk)).pk)
    return runs


def _work(instances, now: dt.datetime) -> dict[int, InstanceWork]:
    starts = _billing_starts(instances)
    billed = [i for i in instances if i.pk in starts]
    ids = [i.pk for i in billed]
    drill_runs = _drill_runs(billed)
    # A regrouped node's boot and restore are those of its first run, from its first resume step.
    first_resume = {i.pk: i.earlier_runs[0]["resume_step"] for i in billed if i.earlier_runs}
    measured, stalls = _measurements(ids, first_resume), _stalls(ids)

    job_rates: dict[int, list[Decimal]] = defaultdict(list)
    for instance in billed:
        m = measured.get(instance.pk)
        if m is not None and m.seconds_per_step is not None:
            job_rates[instance.job_id].append(m.seconds_per_step)

    slots: dict[tuple[int, int], list] = defaultdict(list)
    for _, _, _, run in sorted(r for i in billed for r in _runs(i, starts[i.pk])):
        slots[(run.job_id, run.rank)].append(run)
    # A run an elastic gang went on without (its node lost, or its slot gone in a regroup)
    # kept its work up to the step the gang resumed from (its kept_until), which it made:
    # the gang's checkpoint, or its replicas in the memory tier, prove it, however far its
    # last heartbeat lagged behind. Where no later run of its slot went on from it (the
    # slot's last run, or one a joiner's run resumed past), its steps past that step are
    # lost or redone, not kept.
    dropped = dict(WorldSize.objects.filter(after_instance_id__in=ids).values_list(
        "after_instance_id", Coalesce(RESUME_STEP, 0)))
    by_run = {}
    for slot in slots.values():
        for n, run in enumerate(slot):
            cap = run.kept_until if isinstance(run.pk, tuple) else dropped.get(run.pk)
            if cap is not None:
                slot[n] = dataclasses.replace(run, last_step=max(run.last_step, cap), kept_until=cap)
        for lineage in _lineages(slot):
            last = lineage[-1]
            if last.kept_until is not None and last.kept_until < last.last_step:
                lineage[-1] = dataclasses.replace(last, last_step=max(last.kept_until, last.resume_step))
            by_run.update(kept_and_recomputed(lineage))
    steps = defaultdict(lambda: (0, 0))
    for run_key, (kept, redone) in by_run.items():
        pk = run_key[0] if isinstance(run_key, tuple) else run_key
        steps[pk] = (steps[pk][0] + kept, steps[pk][1] + redone)

    work = {}
    for instance in billed:
        start, end = starts[instance.pk], instance.ended_at
        m = measured.get(instance.pk)
        rates = job_rates[instance.job_id]
        rate = m.seconds_per_step if m and m.seconds_per_step is not None else (
            (sum(rates) / len(rates)).quantize(Decimal("0.000001")) if rates else Decimal(0))
        until = m.restored if m and m.restored else (end or now)
        booting = max(Decimal(0), Decimal(str((min(until, end or now) - start).total_seconds())))
        kept, redone = steps[instance.pk]
        disk = instance.disk_kept and end is not None
        work[instance.pk] = InstanceWork(
            instance_id=instance.pk, job_id=instance.job_id, rank=instance.rank, billed_from=start, billed_to=end,
            resume_step=instance.resume_step, last_step=instance.last_step, steps_kept=kept, recomputed_steps=redone,
            seconds_per_step=rate, boot_restore_seconds=booting,
            checkpoint_stall_seconds=stalls.get(instance.pk, Decimal(0)),
            stopped_disk=instance.stopped_disk_sku if disk else "",
            disk_released=instance.storage_released_at if disk else None,
            drill=instance.pk in drill_runs,
        )
    return work


def _interval(instance: Instance, work: InstanceWork) -> ledger.InstanceInterval:
    return ledger.InstanceInterval(
        instance_id=str(instance.pk), provider=instance.provider, region=instance.region, zone=instance.zone,
        instance_type=instance.instance_type, market=instance.market, start=work.billed_from, end=work.billed_to,
        steps_kept=work.steps_kept, seconds_per_step=work.seconds_per_step,
        boot_restore_seconds=work.boot_restore_seconds, checkpoint_stall_seconds=work.checkpoint_stall_seconds,
        recomputed_steps=work.recomputed_steps,
        stopped_disk=work.stopped_disk, disk_released=work.disk_released, drill=work.drill,
    )


def price_index(instances, now: dt.datetime, disks=()) -> ledger.PriceIndex:
    """Every quote that can be in force for these instances (both markets: the baseline
    needs on-demand), and those of the stopped disks `disks` ((provider, region, sku) each)."""
    keys = {(i.provider, i.region, i.instance_type) for i in instances}
    if not keys:
        return ledger.PriceIndex([])
    where = reduce(or_, (Q(provider=p, region=r, instance_type=t) for p, r, t in keys))
    rows = PriceQuote.objects.filter(where, observed_at__lte=now).values_list(
        "provider", "region", "zone", "instance_type", "market", "usd_per_hour", "observed_at")
    quotes = [Quote(provider=p, region=r, zone=z, instance_type=t, market=m, usd_per_hour=price, observed_at=at)
              for p, r, z, t, m, price, at in rows]
    if disks:
        where = reduce(or_, (Q(provider=p, region=r, sku=sku) for p, r, sku in disks))
        quotes += [DiskQuote(provider=p, region=r, sku=sku, usd_per_month=price, observed_at=at)
                   for p, r, sku, price, at in DiskPriceQuote.objects.filter(where, observed_at__lte=now)
                   .values_list("provider", "region", "sku", "usd_per_month", "observed_at")]
    return ledger.PriceIndex(quotes)


def _instances_of_jobs(job_ids) -> list[Instance]:
    # A run resumed from the memory tier went on from that step, which no checkpoint's writer
    # holds: kept_and_recomputed finds its origin in its slot's earlier run that reached it.
    return list(Instance.objects.filter(job_id__in=job_ids)
                .annotate(resume_step=RESUME_STEP, resume_from=RESUMED_FROM_WRITER)
                .only("id", "job_id", "rank", "provider", "region", "zone", "instance_type", "market",
                      "registered_at", "running_at", "ended_at", "last_step", "requested_at", "end_reason",
                      "stopped_disk_sku", "storage_released_at", "earlier_runs"))


def _prepared(job_ids, now):
    instances = _instances_of_jobs(job_ids)
    for instance in instances:
        instance.resume_step = instance.resume_step or 0
    work = _work(instances, now)
    billed = [i for i in instances if i.pk in work]
    disks = {(i.provider, i.region, work[i.pk].stopped_disk) for i in billed if work[i.pk].stopped_disk}
    return billed, work, price_index(billed, now, disks)


# ---- answers ----------------------------------------------------------------------------------

def job_costs(job_ids, now: dt.datetime | None = None) -> dict[int, JobCost]:
    """Money of each job in `job_ids` (every one gets an answer, zero when never billed)."""
    answers = job_costs_or_errors(job_ids, now)
    for answer in answers.values():
        if isinstance(answer, CostError):
            raise answer
    return answers


def job_costs_or_errors(job_ids, now: dt.datetime | None = None) -> dict[int, JobCost | CostError]:
    """As `job_costs`, but a job the price book cannot price gets its error instead of
    failing the others."""
    now = now or timezone.now()
    job_ids = list(job_ids)
    billed, work, prices = _prepared(job_ids, now)
    by_job: dict[int, list[Instance]] = defaultdict(list)
    for instance in billed:
        by_job[instance.job_id].append(instance)
    answers = {}
    for job_id in job_ids:
        mine = by_job.get(job_id, [])
        try:
            job_ledger = ledger.build_ledger([_interval(i, work[i.pk]) for i in mine], prices, now)
        except ledger.LedgerError as exc:
            answers[job_id] = CostError(f"job {job_id}: {exc}")
            continue
        answers[job_id] = JobCost(job_id=job_id, ledger=job_ledger, work={i.pk: work[i.pk] for i in mine}, now=now)
    return answers


def job_cost(job: Job | int, now: dt.datetime | None = None) -> JobCost:
    job_id = job if isinstance(job, int) else job.pk
    return job_costs([job_id], now)[job_id]


# ---- what a settled figure depends on -----------------------------------------------------------

_SETTLED_MARKS = """(SELECT CAST(COUNT(*) AS TEXT) || ':' || CAST(COUNT(CASE WHEN i.state IN ({live})
        OR i.ended_at IS NULL OR ({disk_open}) THEN 1 END) AS TEXT)
        || ':' || COALESCE(CAST(MAX(i.ended_at) AS TEXT), '') || '|' || COALESCE(CAST(MAX(i.storage_released_at) AS TEXT), '')
    FROM {instance} i WHERE i.job_id = {job}.id),
(SELECT MAX(c.id) FROM {checkpoint} c WHERE c.job_id = {job}.id),
(SELECT CAST(COALESCE(MAX(q.id), 0) AS TEXT) FROM {quote} q) || ':'
    || (SELECT CAST(COALESCE(MAX(d.id), 0) AS TEXT) FROM {disk_quote} d)"""
# Instance.DISK_KEPT with no release yet: its disk bills by the second, as a live VM does.
_DISK_OPEN = "i.end_reason = %s AND i.stopped_disk_sku <> '' AND i.storage_released_at IS NULL"
_MARKS_BATCH = 500  # ids per query, well under SQLite's limit on bound parameters


def settled_mark_columns(job: str) -> tuple[str, list]:
    """What a job's money depends on once no instance of it lives, as three SQL columns
    (and their parameters) of a query over jobs aliased `job`; `settled_key` reads them.

    A job whose every instance has ended, and whose evicted VMs' stopped disks were
    all released, is billed for fixed intervals; its figure can then only move with a
    new instance (the count), an end or a disk release recorded later (the newest of
    each), a checkpoint reported late by a fenced instance (its stall is waste) or a
    VM or disk price quote added or backfilled (the newest quotes). In SQL because
    the dashboard asks it for every row it shows on every poll, where building it
    with the ORM took several times longer than the database takes to answer."""
    live = sorted(InstanceState.LIVE)
    sql = _SETTLED_MARKS.format(instance=Instance._meta.db_table, checkpoint=Checkpoint._meta.db_table,
                                quote=PriceQuote._meta.db_table, disk_quote=DiskPriceQuote._meta.db_table, job=job,
                                live=", ".join(["%s"] * len(live)), disk_open=_DISK_OPEN)
    return sql, [*live, EndReason.PREEMPTED]


def settled_key(job_id: int, marks) -> str | None:
    """A key that changes whenever the job's money could change once no instance of it
    lives, from its `settled_mark_columns`; None while an instance lives or a stopped
    disk bills (its money grows by the second)."""
    instances, last_checkpoint, newest_quotes = marks
    count, open_, last_ends = instances.split(":", 2)  # the newest end and release, text in the database's format
    if int(open_):
        return None
    return f"{job_id}:{count}:{last_ends.replace(' ', 'T')}:{last_checkpoint}:{newest_quotes}"


def settled_keys(job_ids) -> dict[int, str | None]:
    """`settled_key` of each job."""
    job_ids, keys = list(job_ids), {}
    columns, params = settled_mark_columns("j")
    for i in range(0, len(job_ids), _MARKS_BATCH):
        batch = job_ids[i:i + _MARKS_BATCH]
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT j.id, {columns} FROM {Job._meta.db_table} j "
                           f"WHERE j.id IN ({', '.join(['%s'] * len(batch))})", [*params, *batch])
            keys.update((job_id, settled_key(job_id, marks)) for job_id, *marks in cursor.fetchall())
    return keys


# ---- a team's month ---------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True, slots=True)
class JobMonth:
    """One job's share of one UTC month."""

    spent: Decimal
    baseline: Decimal
    waste: Decimal
    billed_seconds: int
    drill: Decimal = Decimal(0)
    """The part of spent that drills spent (ledger.Drill)."""


def job_months(cost: JobCost) -> dict[str, JobMonth]:
    seconds: dict[str, int] = defaultdict(int)
    for instance in cost.ledger.instances:
        for month, n in instance.seconds_by_month.items():
            seconds[month] += n
    return {month: JobMonth(spent=row.spent, baseline=row.baseline, waste=row.waste, billed_seconds=seconds[month],
                            drill=row.drill)
            for month, row in cost.ledger.by_month.items()}


@dataclass(frozen=True, kw_only=True, slots=True)
class MonthSum:
    """Jobs' months added up: exact sums, so the order of adding does not matter."""

    spent: Decimal = Decimal(0)
    baseline: Decimal = Decimal(0)
    waste: Decimal = Decimal(0)
    gpu_seconds: int = 0
    jobs: int = 0
    drill: Decimal = Decimal(0)

    def plus(self, month: JobMonth | None, accelerators: int) -> MonthSum:
        """Counts the job; `month` is None for a job of the month with nothing billed in it."""
        if month is None:
            return self + MonthSum(jobs=1)
        return self + MonthSum(spent=month.spent, baseline=month.baseline, waste=month.waste,
                               gpu_seconds=month.billed_seconds * accelerators, jobs=1, drill=month.drill)

    def __add__(self, other: MonthSum) -> MonthSum:
        return MonthSum(spent=self.spent + other.spent, baseline=self.baseline + other.baseline,
                        waste=self.waste + other.waste, gpu_seconds=self.gpu_seconds + other.gpu_seconds,
                        jobs=self.jobs + other.jobs, drill=self.drill + other.drill)


@dataclass(frozen=True, kw_only=True, slots=True)
class TeamMonthCost:
    team_id: int
    month: str
    spent: Decimal
    baseline: Decimal
    waste: Decimal
    gpu_hours: Decimal
    jobs: int
    budget: Decimal | None
    now: dt.datetime
    drill: Decimal = Decimal(0)
    """The part of spent (the bill, what the budget counts) that drills spent."""

    @property
    def savings(self) -> Decimal:
        return self.baseline - (self.spent - self.drill)

    @classmethod
    def of(cls, team, label: str, total: MonthSum, now: dt.datetime) -> TeamMonthCost:
        return cls(team_id=team.pk, month=label, spent=total.spent, baseline=total.baseline, waste=total.waste,
                   gpu_hours=(Decimal(total.gpu_seconds) / 3600).quantize(Decimal("0.01")), jobs=total.jobs,
                   budget=team.monthly_budget_usd, now=now, drill=total.drill)


def month_jobs(team, start: dt.datetime, end: dt.datetime):
    """The team's jobs with an instance requested before the month ends and not ended
    before it began, or whose stopped disk was not released before it began."""
    disk_in_month = Instance.DISK_KEPT & (Q(storage_released_at__isnull=True) | Q(storage_released_at__gte=start))
    in_month = Instance.objects.filter(job=OuterRef("pk"), requested_at__lt=end).filter(
        Q(ended_at__isnull=True) | Q(ended_at__gte=start) | disk_in_month)
    return Job.objects.filter(team=team).filter(Exists(in_month))


@cache
def _cpu_types() -> frozenset[str]:
    """Instance types without accelerators, by the shipped price book (local cpu-small)."""
    from respawn_server.jobs.money.pricebook import load_price_book

    return frozenset(kind for kind, count in load_price_book().accelerators.items() if count == 0)


def accelerators_by_job(jobs) -> dict[int, int]:
    """Each job's accelerators per node as its GPU-hours count them: the job's
    accelerator_count, but none for a job whose VMs are all of CPU types (a job asks for
    a GPU by default; on the local provider it gets none). One query."""
    accelerated = Instance.objects.filter(job=OuterRef("pk")).exclude(instance_type__in=_cpu_types())
    return dict(jobs.annotate(counted=Case(When(Exists(accelerated), then=F("accelerator_count")), default=Value(0)))
                .values_list("pk", "counted"))


def month_sum(costs_by_job: dict[int, JobCost], accelerators: dict[int, int], label: str) -> MonthSum:
    total = MonthSum()
    for job_id, cost in costs_by_job.items():
        total = total.plus(job_months(cost).get(label), accelerators[job_id])
    return total


def team_month_cost(team, month: str | None = None, now: dt.datetime | None = None) -> TeamMonthCost:
    """A team's spend, on-demand baseline, savings and waste in one UTC month: the sum
    of its jobs' shares of the month.

    Kept work needs each job's whole history, so every instance of a job that was
    billed in the month enters its ledger; only the month's share is reported."""
    now = now or timezone.now()
    label, start, end = parse_month(month, now)
    accelerators = accelerators_by_job(month_jobs(team, start, end))
    try:
        answers = job_costs(accelerators, now)
    except CostError as exc:
        raise CostError(f"team {team.pk}: {exc}") from exc
    return TeamMonthCost.of(team, label, month_sum(answers, accelerators, label), now)


def interruptions_by_placement(team, month: str | None = None, now: dt.datetime | None = None) -> list[dict]:
    """Interruptions in the month per cloud / zone / instance type / kind.

    Preemptions and losses are counted once per instance from how it ended (an
    agent's own "preempted" exit leaves no interruption row, a confirmed one does);
    capacity errors from their interruption rows, and notices only while they are
    not yet a preemption: a notice and the preemption it announced are one
    interruption."""
    _, start, end = parse_month(month, now or timezone.now())
    return interruptions_between(team, start, end)


def interruptions_between(team, start: dt.datetime, end: dt.datetime) -> list[dict]:
    """`interruptions_by_placement` from `start` (included) to `end` (excluded)."""
    where = dict(cloud=F("provider"), zone_name=F("zone"), type_name=F("instance_type"))
    # A drill's interruption (its notice, its end) is a rehearsal, never counted as one.
    ended = (Instance.objects.filter(not_drilled(), job__team=team, end_reason__in=(EndReason.PREEMPTED, EndReason.LOST),
                                     ended_at__gte=start, ended_at__lt=end)
             .values(kind_name=F("end_reason"), **where).annotate(count=Count("id")))
    events = (InterruptionEvent.objects.filter(
        instance__job__team=team, kind__in=(InterruptionKind.NOTICE, InterruptionKind.CAPACITY_ERROR),
        received_at__gte=start, received_at__lt=end)
        .exclude(instance__in=Drill.objects.filter(status__in=DrillStatus.INTERRUPTING).values("instance_id"))
        .exclude(kind=InterruptionKind.NOTICE, instance__end_reason__in=(EndReason.PREEMPTED, EndReason.LOST))
        .values(kind_name=F("kind"), **{k: F(f"instance__{v.name}") for k, v in where.items()})
        .annotate(count=Count("id")))
    rows = [{"cloud": r["cloud"], "zone": r["zone_name"], "instance_type": r["type_name"], "kind_name": r["kind_name"],
             "count": r["count"]} for r in (*ended, *events)]
    return sorted(rows, key=lambda r: (r["cloud"], r["zone"], r["instance_type"], r["kind_name"]))
