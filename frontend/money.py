"""The dashboard's money: the ledger's figures (`respawn_server.jobs.money.costs`) in the API's format
(`respawn_server.jobs.api.costs`), kept in the shared cache once they are settled, so a page that
is polled every few seconds does not price a job's whole history each time.

- A job's money is settled once none of its instances lives and no evicted VM's
  stopped disk still bills. It is stored (with its cost curve) under
  `costs.settled_key`, which changes with everything the figure depends on (a disk
  released later among them), so a stored figure is never stale. A job with a live
  instance or a billing disk accrues every second and is priced on each request
  (only those jobs).
- A team's month is the sum of its jobs' months, the sum `costs.team_month_cost`
  answers through the API. The settled jobs' part is stored under a key made of
  the number of the team's live instances and the newest instance, checkpoint,
  interruption, price quote and disk price quote anywhere: an instance that ends lowers the count, a
  new one moves the newest id, so the part is summed again (from the stored job
  figures) whenever it could have moved. The jobs with a live instance are priced
  and added on each request.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal

from django.core.cache import cache

from respawn_server.jobs.api.costs import job_cost_data, team_month_data
from respawn_server.jobs.fleet.placement import interruption_rates
from respawn_server.jobs.money import costs
from respawn_server.jobs.money.curve import cost_curve
from respawn.vocabulary.money import money_figures
from respawn.vocabulary.money import usd as display_money

JOB_TTL_S = 3600
TEAM_TTL_S = 3600
PRICING_BATCH = 500  # jobs priced in one go when many are missing (a team's month, the first time)
# Placement's interruption-rate estimates read every instance of the last 30 days;
# they are estimates that move slowly, so the overview recomputes them at most this often.
RATES_TTL_S = 60
RATES_KEY = "respawn:interruption-rates:3:{team}"  # "3": a team's own evidence (events, exposure)


# ---- a job ------------------------------------------------------------------------------------

def _documents(cost: costs.JobCost, *, with_curve: bool) -> dict[str, dict | list]:
    """What pages need of a job's ledger, in plain strings (cheap to store and load):
    a summary (the figures a list row shows, the newest instance's speed for the ETA
    and each month's share for a team's month), the API's whole answer and the cost
    curve for the job page, kept apart so a list does not load every instance's detail."""
    detail = job_cost_data(cost)
    newest = max(cost.work.values(), key=lambda w: w.billed_from, default=None)
    summary = {
        "spent": detail["spent"], "savings": detail["savings"], "waste": detail["waste"]["total"],
        **{f"{key}_display": text for key, text in money_figures(
            detail["spent"], detail["savings"], detail["on_demand_baseline"]).items()},
        "waste_display": display_money(detail["waste"]["total"]),
        "waste_parts_display": waste_parts_display(detail["waste"]),
        # What drills spent, apart from spent and savings (shown only for a job drilled).
        "drills": detail["drills"]["total"],
        "drills_display": display_money(detail["drills"]["total"]) if Decimal(detail["drills"]["total"]) else "",
        "drills_parts_display": parts_display(detail["drills"], DRILL_PARTS),
        "seconds_per_step": str(newest.seconds_per_step) if newest else None,
        "months": {month: (str(row.spent), str(row.baseline), str(row.waste), row.billed_seconds, str(row.drill))
                   for month, row in costs.job_months(cost).items()},
    }
    return {"summary": summary, "detail": detail, "curve": cost_curve(detail, cost.now) if with_curve else None}


WASTE_PARTS = (("recomputed", "recomputed"), ("boot_restore", "boot/restore"),
               ("checkpoint_stalls", "checkpoint stalls"), ("stopped_disk", "stopped disk"))
DRILL_PARTS = (("lost_work", "lost work"), ("replacement_boot", "replacement boot"))


def parts_display(figures: dict, parts) -> str:
    """A breakdown in a line, e.g. "recomputed $0.10 · boot/restore $0.15 · …"."""
    return " · ".join(f"{label} {display_money(figures[part])}" for part, label in parts)


def waste_parts_display(waste: dict) -> str:
    return parts_display(waste, WASTE_PARTS)


KINDS = ("summary", "detail", "curve")
# In the keys: documents stored by an older release are not read (2: savings with their share;
# 3: money_figures; 4: drills apart).
DOCUMENTS_VERSION = 4


def _stored_as(kind: str, settled_key: str) -> str:
    return f"respawn:job{kind}:{DOCUMENTS_VERSION}:{settled_key}"


def job_money(keys: dict[int, str | None], now: dt.datetime, *, detail: bool = False) -> dict[int, dict | str]:
    """Each job's money summary (with the API's `detail` and the cost `curve` if asked),
    or why the price book cannot price it (one job's missing quote must not blank a
    whole list). `keys`: job id -> `costs.settled_key`."""
    kinds = KINDS if detail else ("summary",)
    stored_as = {job_id: {kind: _stored_as(kind, key) for kind in kinds}
                 for job_id, key in keys.items() if key is not None}
    stored = cache.get_many([name for names in stored_as.values() for name in names.values()])
    found = {}
    for job_id, names in stored_as.items():
        answers = {kind: stored.get(name) for kind, name in names.items()}
        if isinstance(answers["summary"], str):  # stored: it cannot be priced
            found[job_id] = answers["summary"]
        elif None not in answers.values():
            found[job_id] = answers.pop("summary") | answers
    missing = [job_id for job_id in keys if job_id not in found]
    fresh, to_store = {}, {}
    for i in range(0, len(missing), PRICING_BATCH):
        for job_id, answer in costs.job_costs_or_errors(missing[i:i + PRICING_BATCH], now).items():
            settled = job_id in stored_as
            if isinstance(answer, costs.CostError):
                fresh[job_id] = str(answer)
                if settled:
                    to_store[_stored_as("summary", keys[job_id])] = str(answer)
                continue
            documents = _documents(answer, with_curve=detail)
            fresh[job_id] = documents["summary"] | ({kind: documents[kind] for kind in KINDS[1:]} if detail else {})
            if settled:  # a list or a team's month stores the summary; the job page the rest
                to_store.update({_stored_as(kind, keys[job_id]): documents[kind] for kind in kinds})
    cache.set_many(to_store, JOB_TTL_S)
    return {**found, **fresh}


def _job_month(summary: dict, label: str) -> costs.JobMonth | None:
    row = summary["months"].get(label)
    return costs.JobMonth(spent=Decimal(row[0]), baseline=Decimal(row[1]), waste=Decimal(row[2]),
                          billed_seconds=row[3], drill=Decimal(row[4])) if row else None


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
    """Jobs with an instance that is not live but has no end (billed up to now): priced each time."""


def team_month(team, label: str, now: dt.datetime, *, live: list[tuple[int, int]], newest: tuple) -> TeamMonth:
    """`live`: the team's `reads.live_instances`; `newest`: `reads.newest_ids`."""
    live_jobs = {job_id for _, job_id in live}
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
    accelerators = {job_id: n for job_id, n in costs.accelerators_by_job(costs.month_jobs(team, start, end)).items()
                    if job_id not in live_jobs}
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
    accelerators = costs.accelerators_by_job(costs.month_jobs(team, start, end).filter(pk__in=job_ids))
    answers = costs.job_costs_or_errors(accelerators, now)
    errors = [str(a) for a in answers.values() if isinstance(a, costs.CostError)]
    if errors:
        return costs.MonthSum(), f"team {team.pk}: {errors[0]}"
    return costs.month_sum(answers, accelerators, label), None


def display_rate(per_hour: float) -> str:
    """A rate to two significant digits, whatever its size ("36", "0.00018"); below
    once a century, "0"."""
    if per_hour < 1e-6:
        return "0"
    places = max(0, 1 - math.floor(math.log10(per_hour)))
    return f"{Decimal(repr(per_hour)).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP):f}"


def placement_rates(team_id: int) -> list[dict]:
    """Placement's interruption-rate estimates where the team has some exposure, ready to
    show (the rate with its 90 % credible interval, the team's exposure as a duration),
    recomputed at most every RATES_TTL_S. The evidence is the team's own: no other
    team's usage shows (respawn_server.jobs.fleet.placement.interruption_rates)."""
    from respawn_server.frontend.selectors import display_duration  # selectors reads this module's money

    key = RATES_KEY.format(team=team_id)
    rates = cache.get(key)
    if rates is None:
        rates = [r | {"per_hour_display": display_rate(r["per_hour"]),
                      "credible_display": f"{display_rate(r['per_hour_low'])}–{display_rate(r['per_hour_high'])}",
                      "exposure_display": display_duration(round(r["exposure_hours"] * 3600))}
                 for r in interruption_rates([team_id]) if r["exposure_hours"] > 0]
        cache.set(key, rates, RATES_TTL_S)
    return rates
