"""A team's savings report over a range of UTC months: what its spot work cost against
what the same work would have cost on on-demand, per month and per job, its waste by
kind and its interruptions per zone.

Every figure is the ledger's (`respawn_server.jobs.money.costs`), the one the job pages and the team's
month answer from, never recomputed here:

- a job's row is its whole ledger (the figures of its page and of `/jobs/{id}/cost/`),
  for every job billed in the range; the totals and the waste by kind add those rows up;
- a month's row is the sum of its jobs' shares of that month (what `/teams/{id}/cost/`
  answers for the month), so a job billed across the range's edge counts in the month
  rows only for its months inside the range, and the month rows may then add up to less
  than the totals;
- a job the price book cannot price is listed apart with the reason, in no sum.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal

from django.utils import timezone

from respawn_server.jobs.core.choices import EndReason, InterruptionKind
from respawn_server.jobs.money import costs, ledger

MAX_MONTHS = 120  # one request prices every job of the range: ten years at most
DEFAULT_MONTHS = 12  # without `from`: the year up to `to`
INTERRUPTION_KINDS = (EndReason.PREEMPTED, EndReason.LOST, InterruptionKind.NOTICE, InterruptionKind.CAPACITY_ERROR)


class ReportError(costs.CostError):
    """A range the report cannot take; `field` names the request field at fault."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, kw_only=True, slots=True)
class MonthRow:
    month: str
    spent: Decimal
    baseline: Decimal
    waste: Decimal
    jobs: int
    drill: Decimal = Decimal(0)

    @property
    def savings(self) -> Decimal:
        return self.baseline - (self.spent - self.drill)


@dataclass(frozen=True, kw_only=True, slots=True)
class JobRow:
    job_id: int
    name: str
    status: str
    preemptions: int
    cost: costs.JobCost

    @property
    def ledger(self) -> ledger.Ledger:
        return self.cost.ledger


@dataclass(frozen=True, kw_only=True, slots=True)
class ZoneInterruptions:
    cloud: str
    zone: str
    counts: dict[str, int]  # INTERRUPTION_KINDS -> count

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True, kw_only=True, slots=True)
class SavingsReport:
    team_id: int
    first: str
    last: str
    now: dt.datetime
    months: list[MonthRow]
    jobs: list[JobRow]
    unpriced: dict[int, str]  # job id -> why the price book cannot price it
    waste: ledger.Waste
    interruptions: list[ZoneInterruptions]

    @property
    def spent(self) -> Decimal:
        return sum((row.ledger.spent for row in self.jobs), Decimal(0))

    @property
    def baseline(self) -> Decimal:
        return sum((row.ledger.baseline for row in self.jobs), Decimal(0))

    @property
    def drill(self) -> ledger.Drill:
        return sum((row.ledger.drill for row in self.jobs), ledger.Drill())

    @property
    def savings(self) -> Decimal:
        return self.baseline - (self.spent - self.drill.total)


def _index(label: str) -> int:
    """'YYYY-MM' -> months since year 0, so ranges are integer arithmetic."""
    return int(label[:4]) * 12 + int(label[5:]) - 1


def _label(index: int) -> str:
    return f"{index // 12:04d}-{index % 12 + 1:02d}"


def month_range(first: str | None, last: str | None, now: dt.datetime) -> tuple[list[str], dt.datetime, dt.datetime]:
    """(labels of every month from `first` to `last`, first instant, end instant). `last`
    defaults to this month, `first` to DEFAULT_MONTHS - 1 months before `last`."""
    try:
        last_label, _, end = costs.parse_month(last, now)
    except costs.CostError as exc:
        raise ReportError("to", str(exc)) from None
    if first in (None, ""):
        first = _label(max(_index(last_label) - (DEFAULT_MONTHS - 1), _index("%04d-%02d" % costs.FIRST_MONTH)))
    try:
        first_label, start, _ = costs.parse_month(first, now)
    except costs.CostError as exc:
        raise ReportError("from", str(exc)) from None
    count = _index(last_label) - _index(first_label) + 1
    if count < 1:
        raise ReportError("from", f"from ({first_label}) must not be after to ({last_label})")
    if count > MAX_MONTHS:
        raise ReportError("from", f"a report covers at most {MAX_MONTHS} months ({first_label} to {last_label} is {count})")
    return [_label(_index(first_label) + i) for i in range(count)], start, end


def interruptions_by_zone(team, start: dt.datetime, end: dt.datetime) -> list[ZoneInterruptions]:
    """`costs.interruptions_between` per cloud and zone, instance types added up."""
    counts: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: dict.fromkeys(INTERRUPTION_KINDS, 0))
    for row in costs.interruptions_between(team, start, end):
        counts[(row["cloud"], row["zone"])][row["kind_name"]] += row["count"]
    return [ZoneInterruptions(cloud=cloud, zone=zone, counts=found) for (cloud, zone), found in sorted(counts.items())]


def savings_report(team, first: str | None = None, last: str | None = None, now: dt.datetime | None = None) -> SavingsReport:
    """The team's report for the months `first`..`last` (YYYY-MM, UTC); ReportError naming
    the field when the range is not one."""
    now = now or timezone.now()
    labels, start, end = month_range(first, last, now)
    jobs = {job["pk"]: job for job in costs.month_jobs(team, start, end)
            .values("pk", "name", "status", "preemptions").order_by("pk")}
    answers = costs.job_costs_or_errors(jobs, now)
    priced = {job_id: answer for job_id, answer in answers.items() if not isinstance(answer, costs.CostError)}
    shares = {job_id: costs.job_months(cost) for job_id, cost in priced.items()}
    months = []
    for label in labels:
        mine = [share[label] for share in shares.values() if label in share]
        months.append(MonthRow(month=label, spent=sum((m.spent for m in mine), Decimal(0)),
                               baseline=sum((m.baseline for m in mine), Decimal(0)),
                               waste=sum((m.waste for m in mine), Decimal(0)), jobs=len(mine),
                               drill=sum((m.drill for m in mine), Decimal(0))))
    rows = [JobRow(job_id=job_id, name=jobs[job_id]["name"], status=jobs[job_id]["status"],
                   preemptions=jobs[job_id]["preemptions"], cost=cost) for job_id, cost in priced.items()]
    waste = ledger.Waste(*(sum((getattr(row.ledger.waste, part) for row in rows), Decimal(0)) for part in ledger.Waste.PARTS))
    return SavingsReport(team_id=team.pk, first=labels[0], last=labels[-1], now=now, months=months, jobs=rows,
                         unpriced={job_id: str(answer) for job_id, answer in answers.items() if job_id not in priced},
                         waste=waste, interruptions=interruptions_by_zone(team, start, end))
