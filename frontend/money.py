"""The dashboard's money: the ledger's figures (`jobs.costs`) in the API's format
(`jobs.api.costs`), kept in the shared cache once they are settled, so a page that
is polled every few seconds does not price a job's whole history each time.

- A job's money is settled once none of its instances lives. It is stored under
  `costs.settled_keys`, which changes with everything the figure depends on, so a
  stored figure is never stale. A job with a live instance accrues every second
  and is priced on each request (only those jobs).
- A team's month is the sum of its jobs' months, the sum `costs.team_month_cost`
  answers through the API. The settled jobs' part is stored under a key made of
  the number of the team's live instances and the newest instance, checkpoint,
  interruption and price quote anywhere: an instance that ends lowers the count, a
  new one moves the newest id, so the part is summed again (from the stored job
  figures) whenever it could have moved. The jobs with a live instance are priced
  and added on each request.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from django.core.cache import cache

from frontend import reads
from jobs import costs
from jobs.api.costs import job_cost_data, team_month_data
from jobs.models import Checkpoint, Instance, InterruptionEvent, PriceQuote
from jobs.placement import interruption_rates

JOB_TTL_S = 3600
TEAM_TTL_S = 3600
PRICING_BATCH = 500  # jobs priced in one go when many are missing (a team's month, the first time)
# Placement's interruption-rate estimates read every instance of the last 30 days;
# they are estimates that move slowly, so the overview recomputes them at most this often.
RATES_TTL_S = 60


# ---- a job ------------------------------------------------------------------------------------

def _document(cost: costs.JobCost) -> dict:
    """What pages need of a job's ledger, in plain values (cheap to store and load):
    the API's figures, each month's share for the team sums, and the newest
    instance's speed for the ETA."""
    newest = max(cost.work.values(), key=lambda w: w.billed_from, default=None)
    return {
        "detail": job_cost_data(cost),
        "months": {month: (row.spent, row.baseline, row.waste, row.billed_seconds)
                   for month, row in costs.job_months(cost).items()},
        "seconds_per_step": newest.seconds_per_step if newest else None,
    }


def _job_key(settled_key: str) -> str:
    return f"respawn:jobmoney:{settled_key}"


def job_money(keys: dict[int, str | None], now: dt.datetime) -> dict[int, dict | str]:
    """Each job's money document, or why the price book cannot price it (one job's
    missing quote must not blank a whole list). `keys`: job id -> `costs.settled_key`."""
    job_ids = list(keys)
    stored_as = {job_id: _job_key(key) for job_id in job_ids if (key := keys.get(job_id)) is not None}
    stored = cache.get_many(list(stored_as.values()))
    found = {job_id: stored[key] for job_id, key in stored_as.items() if key in stored}
    missing = [job_id for job_id in job_ids if job_id not in found]
    fresh = {}
    for i in range(0, len(missing), PRICING_BATCH):
        for job_id, answer in costs.job_costs_or_errors(missing[i:i + PRICING_BATCH], now).items():
            fresh[job_id] = str(answer) if isinstance(answer, costs.CostError) else _document(answer)
    cache.set_many({stored_as[job_id]: answer for job_id, answer in fresh.items() if job_id in stored_as}, JOB_TTL_S)
    return {**found, **fresh}


def _job_month(document: dict, label: str) -> costs.JobMonth | None:
    row = document["months"].get(label)
    return costs.JobMonth(spent=row[0], baseline=row[1], waste=row[2], billed_seconds=row[3]) if row else None


# ---- a team's month ---------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True, slots=True)
class TeamMonth:
    money: dict | None
    """The API's answer for the month; None when it cannot be priced."""
    error: str | None
    interruptions: list[dict]
    live_instances: int


@dataclass(frozen=True, kw_only=True, slots=True)
class _SettledPart:
    total: costs.MonthSum
    error: str | None
    interruptions: list[dict]
    open_jobs: list[int] = field(default_factory=list)
    """Jobs with an instance not live yet without an end (billed to now): priced each time."""


_CHANGE_MARKS = ("SELECT (SELECT MAX(id) FROM {instance}), (SELECT MAX(id) FROM {checkpoint}), "
                 "(SELECT MAX(id) FROM {interruption}), (SELECT MAX(id) FROM {quote})").format(
    instance=Instance._meta.db_table, checkpoint=Checkpoint._meta.db_table,
    interruption=InterruptionEvent._meta.db_table, quote=PriceQuote._meta.db_table)


def team_month(team, label: str, now: dt.datetime) -> TeamMonth:
    live = reads.live_instances(team.pk)
    live_jobs = {job_id for _, job_id in live}
    newest = reads.rows(_CHANGE_MARKS)[0]
    key = f"respawn:teammonth:{team.pk}:{label}:{len(live)}:{':'.join(map(str, newest))}"
    settled = cache.get(key)
    if settled is None:
        settled = _settled_part(team, label, now, live_jobs)
        cache.set(key, settled, TEAM_TTL_S)
    total, error = settled.total, settled.error
    priced_now = live_jobs | set(settled.open_jobs)
    if priced_now:
        part, live_error = _priced_part(team, label, now, priced_now)
        total, error = total + part, error or live_error
    money = None if error else team_month_data(costs.TeamMonthCost.of(team, label, total, now))
    return TeamMonth(money=money, error=error, interruptions=settled.interruptions, live_instances=len(live))


def _settled_part(team, label: str, now: dt.datetime, live_jobs: set[int]) -> _SettledPart:
    _, start, end = costs.parse_month(label, now)
    accelerators = {job_id: n for job_id, n in costs.month_jobs(team, start, end)
                    .values_list("pk", "accelerator_count") if job_id not in live_jobs}
    keys = costs.settled_keys(accelerators)
    settled = {job_id: key for job_id, key in keys.items() if key is not None}
    documents = job_money(settled, now)
    total, errors = costs.MonthSum(), []
    for job_id in settled:
        document = documents[job_id]
        if isinstance(document, str):
            errors.append(document)
            continue
        total = total.plus(_job_month(document, label), accelerators[job_id])
    return _SettledPart(total=total, error=f"team {team.pk}: {errors[0]}" if errors else None,
                        interruptions=costs.interruptions_by_placement(team, label, now),
                        open_jobs=[job_id for job_id, key in keys.items() if key is None])


def _priced_part(team, label: str, now: dt.datetime, job_ids: set[int]) -> tuple[costs.MonthSum, str | None]:
    _, start, end = costs.parse_month(label, now)
    accelerators = dict(costs.month_jobs(team, start, end).filter(pk__in=job_ids)
                        .values_list("pk", "accelerator_count"))
    answers = costs.job_costs_or_errors(accelerators, now)
    errors = [str(a) for a in answers.values() if isinstance(a, costs.CostError)]
    if errors:
        return costs.MonthSum(), f"team {team.pk}: {errors[0]}"
    return costs.month_sum(answers, accelerators, label), None


def placement_rates() -> list[dict]:
    """Placement's interruption-rate estimates with some exposure, recomputed at most every RATES_TTL_S."""
    rates = cache.get("respawn:interruption-rates")
    if rates is None:
        rates = [r for r in interruption_rates() if r["exposure_hours"] > 0]
        cache.set("respawn:interruption-rates", rates, RATES_TTL_S)
    return rates
