"""Where and on which market a job's next VMs go, and how often they checkpoint.

This module reads the database (prices in force, instance lifetimes, capacity
errors and preemptions, the job's measured speed and checkpoint cost) and hands
plain values to the pure policies in jobs/fleet/policies — the same code the trace
simulator (bench/simulate.py) runs."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from statistics import fmean

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from respawn_server.jobs.core.choices import EndReason, InstanceState, InterruptionKind, Market
from respawn_server.jobs.fleet.policies import market as market_policy
from respawn_server.jobs.fleet.policies.expected_cost import (Option, PlacementDecision, PlacementEvent, choose_placement,
                                               spot_overhead_fraction)
from respawn_server.jobs.fleet.policies.interval import IntervalDecision, IntervalOverride, checkpoint_interval
from respawn_server.jobs.fleet.policies.rates import (Lifetime, RateEstimate, RatePrior, estimate_availability, estimate_rate,
                                       on_demand_rate)
from respawn_server.jobs.core.drilled import caused_by_drill, not_drilled
from respawn_server.jobs.fleet.providers.base import Placement
from respawn_server.jobs.models import Instance, InterruptionEvent, Job, PriceQuote
from respawn_server.jobs.money import costs, downtime

LIFETIME_WINDOW = timedelta(days=30)
EVENT_WINDOW = timedelta(hours=2)
DEFAULT_CHECKPOINT_COST_S = 10.0
DEFAULT_RESTART_S = 360.0  # boot + restore before anything is measured ("Can't Be Late" uses 6 min)
DEFAULT_WORK_S = 3600.0
MIN_RECORD_S = 60.0  # wall time on a market before the job's own record there replaces the model
INTERRUPTED = (EndReason.PREEMPTED, EndReason.LOST)
# What the estimates every team's placement shares learn from: what the control plane saw
# (a VM silent past its deadline), or a preemption the cloud confirmed. An agent's word
# that it was preempted alone moves only its own job's next placement (_just_preempted):
# any VM can say it (respawn_server.jobs.fleet.leftovers.confirm_claimed_preemptions).
# A drill's interruption (respawn_server.jobs.drills) is neither: it was asked for, the market did not do it.
SEEN_INTERRUPTED = (Q(end_reason=EndReason.LOST) | Q(end_reason=EndReason.PREEMPTED, preemption_confirmed=True)) \
    & not_drilled()


@dataclass(frozen=True)
class PricedPlacement:
    placement: Placement
    usd_per_hour: Decimal


@dataclass(frozen=True)
class Choice:
    chosen: PricedPlacement | None
    reason: str


def default_zone(provider: str, region: str) -> str:
    """A region-wide quote is placed in the region's first zone (local: the first zone the
    local provider is configured with; its price book prices on-demand region-wide)."""
    if provider == "local":
        return local_zones()[0]
    return {"aws": f"{region}a", "gcp": f"{region}-a", "azure": "1"}.get(provider, region)


def local_zones() -> tuple[str, ...]:
    """The zones the local provider is configured with (its default: local-a..c)."""
    from dataclasses import fields

    from respawn_server.jobs.fleet.providers.local import LocalConfig

    default = next(f.default for f in fields(LocalConfig) if f.name == "zones")
    return tuple(settings.RESPAWN["PROVIDER_CONFIG"].get("local", {}).get("zones") or default)


def priced_placements(job: Job, market: str, now) -> list[PricedPlacement]:
    """Allowed placements with the price in force now."""
    enabled = settings.RESPAWN["PROVIDERS"]
    clouds = [c for c in (job.allowed_clouds or enabled) if c in enabled]
    quotes = PriceQuote.objects.filter(provider__in=clouds, market=market, observed_at__lte=now)
    if job.instance_types:
        quotes = quotes.filter(instance_type__in=job.instance_types)
    if job.allowed_regions:
        quotes = quotes.filter(region__in=job.allowed_regions)
    latest: dict[tuple, PriceQuote] = {}
    for quote in quotes.order_by("observed_at"):
        latest[(quote.provider, quote.region, quote.zone, quote.instance_type)] = quote
    return [
        PricedPlacement(Placement(provider=p, region=r, zone=z or default_zone(p, r), instance_type=t, market=market),
                        q.usd_per_hour)
        for (p, r, z, t), q in latest.items()
    ]


def _key(obj) -> tuple[str, str, str, str, str]:
    return (obj.provider, obj.region, obj.zone, obj.instance_type, obj.market)


def lifetimes(now, team_ids: list[int] | None = None) -> dict[tuple, list[Lifetime]]:
    """Every placement's recent instance lifetimes (of these teams' jobs only, if given):
    exposure, and whether it ended in an interruption seen or confirmed (SEEN_INTERRUPTED),
    with a notice that got a checkpoint committed in time."""
    rows = Instance.objects.filter(running_at__isnull=False, running_at__gte=now - LIFETIME_WINDOW)
    if team_ids is not None:
        rows = rows.filter(job__team_id__in=team_ids)
    saved_in_time = set(InterruptionEvent.objects.filter(
        kind=InterruptionKind.NOTICE, checkpoint_saved=True, instance__in=rows).values_list("instance_id", flat=True))
    seen = set(rows.filter(SEEN_INTERRUPTED).values_list("pk", flat=True))
    found = defaultdict(list)
    for instance in rows.only("pk", "provider", "region", "zone", "instance_type", "market", "running_at",
                              "ended_at"):
        hours = ((instance.ended_at or now) - instance.running_at).total_seconds() / 3600
        interrupted = instance.pk in seen
        found[_key(instance)].append(Lifetime(hours=max(hours, 0.0), interrupted=interrupted,
                                              usable_notice=interrupted and instance.pk in saved_in_time))
    return found


def rate_for(key: tuple, found: dict[tuple, list[Lifetime]]) -> RateEstimate:
    if key[4] == Market.ON_DEMAND:
        return on_demand_rate()
    return estimate_rate(found.get(key, []), RatePrior.from_bucket())


def placement_events(now) -> list[PlacementEvent]:
    """Capacity errors and preemptions of the last hours, for the back-off rules; a
    preemption whose notice save committed in time is marked `saved` (it lost no work)."""
    recent = Instance.objects.filter(ended_at__gte=now - EVENT_WINDOW).filter(
        Q(end_reason=EndReason.CAPACITY_ERROR) | SEEN_INTERRUPTED)
    saved = set(InterruptionEvent.objects.filter(kind=InterruptionKind.NOTICE, checkpoint_saved=True,
                                                 instance__in=recent).values_list("instance_id", flat=True))
    return [PlacementEvent(key=_key(i), kind="capacity_error" if i.end_reason == EndReason.CAPACITY_ERROR
                           else "preempted", at=i.ended_at.timestamp(), saved=i.pk in saved) for i in recent]


@dataclass(frozen=True)
class OwnRecord:
    """What the job's own VMs showed, which placement trusts over priors: its downtime per
    interruption, and per market the share of its VMs' wall time that became kept work."""

    restart_s: float
    kept_fraction: dict[str, float]


def own_record(job: Job, now) -> OwnRecord:
    done = [d.total_s for d in downtime.job_downtime(job.pk, now)[1] if not d.ongoing]
    wall, kept = defaultdict(float), defaultdict(float)
    try:
        work = costs.job_cost(job.pk, now).work
    except costs.CostError:  # a price book that cannot price the job: nothing learnt, priors it is
        work = {}
    markets = dict(job.instances.filter(pk__in=list(work)).values_list("pk", "market"))
    for pk, w in work.items():
        wall[markets[pk]] += ((w.billed_to or now) - w.billed_from).total_seconds()
        kept[markets[pk]] += w.steps_kept * float(w.seconds_per_step)
    return OwnRecord(restart_s=fmean(done) if done else DEFAULT_RESTART_S,
                     kept_fraction={m: min(kept[m] / s, 1.0) for m, s in wall.items() if s >= MIN_RECORD_S})


def seconds_per_step(job: Job) -> float | None:
    per_step = costs.seconds_per_step(job.pk)
    return float(per_step) if per_step is not None else None


def checkpoint_cost_s(job: Job) -> float:
    stalls = [s for s in job.checkpoints.order_by("-committed_at").values_list("stall_s", flat=True)[:10] if s]
    return fmean(stalls) if stalls else DEFAULT_CHECKPOINT_COST_S


def remaining_work_s(job: Job) -> float:
    per_step = seconds_per_step(job)
    if per_step is None or not job.total_steps:
        return DEFAULT_WORK_S
    return max(job.total_steps - job.last_step, 0) * per_step


def _just_preempted(job: Job) -> tuple[str, str] | None:
    last = job.instances.exclude(ended_at=None).order_by("-ended_at").first()
    drilled = last is not None and caused_by_drill(last.pk)  # a drill says nothing of its zone
    return (last.provider, last.zone) if last and last.end_reason in INTERRUPTED and not drilled else None


def choose(job: Job, now=None, leaving: Instance | None = None) -> Choice:
    """The placement with the lowest expected cost to finish, on the market the job's
    settings and deadline call for; None with the reason when nothing fits now.
    `leaving`: a VM under notice, whose zone counts as just preempted (for its spare)."""
    now = now or timezone.now()
    found = lifetimes(now)
    events = placement_events(now)
    record = own_record(job, now)
    markets = _markets(job, now, found, record)
    if markets is None:
        return Choice(None, "waiting: spot has no capacity now and the deadline's slack still covers waiting; "
                            + next_try(None, now))
    just_preempted = (leaving.provider, leaving.zone) if leaving else _just_preempted(job)
    decision, by_key = _decide(job, markets, now, found, events, record, just_preempted)
    if decision.chosen is None and markets == [Market.SPOT] and job.on_demand_after_preemptions is not None:
        # The job allows on-demand: with no spot placement to be had now, it goes on there
        # rather than wait (its preemption count alone would have sent it there later).
        waited = _waiting_reason(decision)
        decision, by_key = _decide(job, [Market.ON_DEMAND], now, found, events, record, just_preempted)
        if decision.chosen is not None:
            return Choice(by_key[decision.chosen.key], f"on-demand, the job's fallback: spot has none now ({waited})")
    if decision.chosen is None:
        return Choice(None, f"waiting: no placement available now ({_waiting_reason(decision)}); "
                            f"{next_try(decision.retry_at, now)}")
    return Choice(by_key[decision.chosen.key], decision.reason)


def _decide(job: Job, markets: list[str], now, found, events, record: OwnRecord, just_preempted):
    priced = [p for m in markets for p in priced_placements(job, m, now)]
    options = [Option(provider=p.placement.provider, region=p.placement.region, zone=p.placement.zone,
                      instance_type=p.placement.instance_type, market=p.placement.market,
                      price_per_hour=float(p.usd_per_hour), rate=rate_for(_key(p.placement), found),
                      kept_fraction=record.kept_fraction.get(p.placement.market))
               for p in priced]
    decision = choose_placement(
        options, work_s=remaining_work_s(job), now=now.timestamp(), nodes=job.nodes, restart_s=record.restart_s,
        checkpoint_cost_s=checkpoint_cost_s(job), events=events, just_preempted=just_preempted,
        max_price_per_hour=float(job.max_price_per_hour) if job.max_price_per_hour is not None else None)
    return decision, {_key(p.placement): p for p in priced}


def _waiting_reason(decision: PlacementDecision) -> str:
    return "; ".join(sorted({e.excluded for e in decision.ranked if e.excluded})) or "no allowed placement is priced"


def next_try(at: float | None, now) -> str:
    """'next try at 17:40:05 UTC': a back-off's end, else the next scheduling pass."""
    when = datetime.fromtimestamp(at, UTC) if at is not None else now + timedelta(
        seconds=settings.RECONCILE_INTERVAL_S)
    return f"next try at {when:%H:%M:%S} UTC"


def _markets(job: Job, now, found, record: OwnRecord) -> list[str] | None:
    """Which markets to consider: the job's fallback setting, or for a job with a
    deadline the deadline-aware rule (None: wait for spot)."""
    if job.on_demand_after_preemptions is not None and job.preemptions >= job.on_demand_after_preemptions:
        return [Market.ON_DEMAND]
    if job.deadline is None:
        return [Market.SPOT]
    spot_keys = [_key(p.placement) for p in priced_placements(job, Market.SPOT, now)]
    events = placement_events(now)
    blocked = {e.key for e in events if e.kind == "capacity_error"}
    rate = estimate_rate([lt for k in spot_keys for lt in found.get(k, [])], RatePrior.from_bucket())
    cost = checkpoint_cost_s(job)
    interval = checkpoint_interval(checkpoint_cost_s=cost, rate=rate).seconds
    clock = job_clock(job, now, spot_available=any(k not in blocked for k in spot_keys), cost=cost)
    overhead = spot_overhead_fraction(rate=rate, availability=estimate_availability(available_s=0, observed_s=0),
                                      restart_s=record.restart_s, checkpoint_cost_s=cost, interval_s=interval)
    if record.kept_fraction.get(Market.SPOT):  # the job's own record on spot: its overhead is known
        overhead = 1 / record.kept_fraction[Market.SPOT] - 1
    chosen = market_policy.deadline_aware(clock, spot_overhead_fraction=overhead)
    return [chosen] if chosen else None


def job_clock(job: Job, now, *, spot_available: bool, running: str | None = None,
              cost: float | None = None) -> market_policy.JobClock:
    """Where a job with a deadline stands, as the market policies read it (`cost`: its
    checkpoint cost, when the caller has it already)."""
    remaining = remaining_work_s(job)
    total = (job.total_steps or 0) * (seconds_per_step(job) or 0) or remaining
    return market_policy.JobClock(
        now=now.timestamp(), started_at=job.created_at.timestamp(), deadline=job.deadline.timestamp(),
        total_work_s=total, remaining_work_s=remaining, unsaved_work_s=0.0, running=running,
        spot_available=spot_available, restart_s=DEFAULT_RESTART_S,
        checkpoint_cost_s=checkpoint_cost_s(job) if cost is None else cost,
        on_demand_interval_s=settings.RESPAWN["DEFAULT_CHECKPOINT_INTERVAL_S"],
        decision_period_s=settings.RECONCILE_INTERVAL_S)


def deadline_slack_s(job: Job, now=None) -> float:
    """Time that would be left at the job's deadline if it went on-demand now and stayed
    there (market.on_demand_slack); negative: even the on-demand fallback misses it."""
    now = now or timezone.now()
    live = job.instances.filter(state__in=InstanceState.LIVE).values_list("market", flat=True).first()
    return market_policy.on_demand_slack(job_clock(job, now, spot_available=False, running=live),
                                         moving=live != Market.ON_DEMAND)


def interval_for(instance: Instance) -> IntervalDecision:
    """Young/Daly for where this instance runs, from the job's measured checkpoint
    cost; the job's own interval (seconds or steps) wins."""
    job = instance.job
    override = None
    if job.checkpoint_interval_s is not None:
        override = IntervalOverride(seconds=job.checkpoint_interval_s)
    elif job.checkpoint_every_steps is not None:
        override = IntervalOverride(steps=job.checkpoint_every_steps)
    per_step = seconds_per_step(job)
    if override is not None and override.steps is not None and per_step is None:
        override = None  # not measured yet: the agent checkpoints every N steps itself meanwhile
    found = lifetimes(timezone.now())
    return checkpoint_interval(checkpoint_cost_s=checkpoint_cost_s(job), rate=rate_for(_key(instance), found),
                               override=override, seconds_per_step=per_step)


def refresh_interval(instance: Instance) -> None:
    """Store the interval the agent is told (respawn_server.jobs.core.services.checkpoint_interval_s reads it):
    on registering, and after each new checkpoint changed the job's measured cost."""
    # JSON (and PostgreSQL's jsonb) has no infinity: on on-demand nothing interrupts,
    # so M and Young/Daly are unbounded, stored as null ("none").
    instance.checkpoint_interval = {name: value if not isinstance(value, float) or math.isfinite(value) else None
                                    for name, value in asdict(interval_for(instance)).items()}
    Instance.objects.filter(pk=instance.pk).update(checkpoint_interval=instance.checkpoint_interval)


def interruption_rates(team_ids: list[int], now=None) -> list[dict]:
    """Every spot placement in the price book or used by these teams, with its estimate.

    The estimate is the one placement uses for every team: pooled over every team's
    instances (rates and their credible interval). The evidence shown with it, `events`
    and `exposure_hours`, is these teams' own: no team reads how much another used a
    placement, nor learns from the list that another used one the price book lacks."""
    now = now or timezone.now()
    found = lifetimes(now)
    own = lifetimes(now, team_ids)
    keys = set(own)
    for quote in PriceQuote.objects.filter(market=Market.SPOT).values_list("provider", "region", "zone",
                                                                          "instance_type", "market").distinct():
        p, r, z, t, m = quote
        keys.add((p, r, z or default_zone(p, r), t, m))
    rows = []
    for key in sorted(keys):
        rate = rate_for(key, found)
        seen = own.get(key, [])
        shown = rate.median_per_hour if rate.median_per_hour is not None else rate.per_hour
        rows.append(dict(zip(("provider", "region", "zone", "instance_type", "market"), key),
                         per_hour=shown, mean_per_hour=rate.per_hour, mtbi_hours=1 / shown if shown > 0 else None,
                         per_hour_low=rate.credible_per_hour[0], per_hour_high=rate.credible_per_hour[1],
                         usable_notice_fraction=rate.usable_notice_fraction,
                         events=sum(lt.interrupted for lt in seen), exposure_hours=sum(lt.hours for lt in seen),
                         prior_per_hour=rate.prior_per_hour))
    return rows
