"""Placement on (re)launch: the lowest expected cost to finish, with back-off.

Expected wall time to finish W seconds of work on an option (first-order model):
each second of work also costs C/τ of checkpointing; each interruption costs the
restart overhead R, plus τ/2 of lost work when it came without a usable notice. So

    efficiency = (1 − λ·R − λ_unnoticed·τ/2) / (1 + C/τ)
    wall       = W / (speed · efficiency)      (infeasible when efficiency ≤ 0)
    cost       = wall · price · nodes

R is the job's own downtime per interruption once it has one (a noticed interruption
whose save committed costs only that), else a prior. Where the job has trained on an
option's market, its own record wins over the model: `kept_fraction`, the share of its
VMs' wall time there that became kept steps, gives wall = W / kept_fraction. A job that
kept work on a market is never told that market cannot make progress.

An option is skipped while on back-off: after capacity errors (5 min, doubling per
consecutive error, at most an hour) and after a burst of preemptions that lost work (3
within an hour without a committed notice save puts it aside for 30 min; one whose
notice save committed lost nothing but its downtime, which the estimate already
counts). A relaunch does not go back to the zone that just preempted unless that zone
is clearly best, i.e. cheaper than every other zone by the margin. An option the model
finds infeasible is a last resort, not a wall: when no other is eligible, the least-bad
one (highest efficiency) is tried, so a job is never held forever by a model's guess.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, replace

from respawn_server.jobs.fleet.policies.interval import IntervalBounds, checkpoint_interval
from respawn_server.jobs.fleet.policies.rates import RateEstimate

CAPACITY_BACKOFF_S = 300.0
CAPACITY_BACKOFF_MAX_S = 3600.0
BURST_WINDOW_S = 3600.0
BURST_PREEMPTIONS = 3
BURST_BACKOFF_S = 1800.0
CLEARLY_BEST_MARGIN = 0.15


@dataclass(frozen=True, kw_only=True, slots=True)
class Option:
    provider: str
    region: str
    zone: str
    instance_type: str
    market: str
    price_per_hour: float
    """Per node."""
    rate: RateEstimate
    speed: float = 1.0
    """Work per second relative to the job's reference speed (measured, or from the type)."""
    kept_fraction: float | None = None
    """The job's own record on this option's market: seconds of kept work per second of its
    VMs' wall time there (boot, restore, saves, downtime and lost steps all counted); None
    when it has not trained there yet."""

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.provider, self.region, self.zone, self.instance_type, self.market)


@dataclass(frozen=True, kw_only=True, slots=True)
class PlacementEvent:
    """A capacity error or a preemption recorded against a placement."""

    key: tuple[str, str, str, str, str]
    kind: str
    """'capacity_error' or 'preempted'."""
    at: float
    saved: bool = False
    """A preemption whose notice save committed in time: it lost no work."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Estimate:
    option: Option
    interval_s: float
    wall_s: float
    cost: float
    excluded: str = ""
    """Why the option is not eligible now ('' when it is)."""
    efficiency: float = 1.0
    """Kept work per second of wall time the estimate expects (≤ 0: the model says none)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PlacementDecision:
    chosen: Option | None
    reason: str
    ranked: tuple[Estimate, ...]
    retry_at: float | None = None
    """Nothing chosen: when the first back-off ends (None: no back-off holds it, e.g. a price
    above the job's maximum, and the caller's next pass is when it tries again)."""


def efficiency(*, rate: RateEstimate, restart_s: float, checkpoint_cost_s: float, interval_s: float) -> float:
    """Kept work per second of wall time on a market interrupted at `rate` (see above)."""
    per_s = rate.per_hour / 3600
    unnoticed_per_s = rate.unnoticed_per_hour / 3600
    return (1 - per_s * restart_s - unnoticed_per_s * interval_s / 2) / (1 + checkpoint_cost_s / interval_s)


def expected_wall_s(*, work_s: float, speed: float, rate: RateEstimate, restart_s: float,
                    checkpoint_cost_s: float, interval_s: float) -> float:
    kept = efficiency(rate=rate, restart_s=restart_s, checkpoint_cost_s=checkpoint_cost_s, interval_s=interval_s)
    return work_s / (speed * kept) if kept > 0 else math.inf


def estimate(option: Option, *, work_s: float, nodes: int, restart_s: float, checkpoint_cost_s: float,
             bounds: IntervalBounds = IntervalBounds()) -> Estimate:
    interval = checkpoint_interval(checkpoint_cost_s=checkpoint_cost_s, rate=option.rate, bounds=bounds).seconds
    if option.kept_fraction:  # the job's own record there: its restarts and losses are in it
        kept = option.kept_fraction
        wall = work_s / kept
    else:
        kept = efficiency(rate=option.rate, restart_s=restart_s, checkpoint_cost_s=checkpoint_cost_s,
                          interval_s=interval) * option.speed
        wall = (work_s / kept if kept > 0 else math.inf) + restart_s
    return Estimate(option=option, interval_s=interval, wall_s=wall, efficiency=kept,
                    cost=wall / 3600 * option.price_per_hour * nodes)


def backoff_until(events, key, now: float) -> float | None:
    """When the placement `key` may be tried again, or None if it may be tried now."""
    mine = sorted(e.at for e in events if e.key == key and e.kind == "capacity_error" and e.at <= now)
    preempted = [e.at for e in events
                 if e.key == key and e.kind == "preempted" and not e.saved and now - e.at < BURST_WINDOW_S]
    until = None
    if mine:
        # consecutive capacity errors: those after the last preemption (a run in between resets)
        last_run = max((e.at for e in events if e.key == key and e.kind == "preempted"), default=-math.inf)
        streak = [t for t in mine if t > last_run]
        if streak:
            until = streak[-1] + min(CAPACITY_BACKOFF_S * 2 ** (len(streak) - 1), CAPACITY_BACKOFF_MAX_S)
    if len(preempted) >= BURST_PREEMPTIONS:
        burst_end = sorted(preempted)[-1] + BURST_BACKOFF_S
        until = max(until or burst_end, burst_end)
    return until if until is not None and until > now else None


def backoff_text(until: float, now: float) -> str:
    """'on back-off for 28 min more (until 2026-12-01 17:40 UTC)': how long, and when in UTC."""
    left = max(1, math.ceil((until - now) / 60))
    return f"on back-off for {left} min more (until {dt.datetime.fromtimestamp(until, dt.UTC):%Y-%m-%d %H:%M} UTC)"


def choose_placement(options, *, work_s: float, now: float, nodes: int = 1, restart_s: float,
                     checkpoint_cost_s: float, events=(), just_preempted: tuple[str, str] | None = None,
                     max_price_per_hour: float | None = None) -> PlacementDecision:
    """Cheapest expected cost to finish; `just_preempted` is the (provider, zone) that just took a node."""
    ranked, ends = [], []
    for option in options:
        est = estimate(option, work_s=work_s, nodes=nodes, restart_s=restart_s,
                       checkpoint_cost_s=checkpoint_cost_s)
        until = backoff_until(events, option.key, now)
        if until is not None:
            ends.append(until)
            est = _excluded(est, backoff_text(until, now))
        elif max_price_per_hour is not None and option.price_per_hour > max_price_per_hour:
            est = _excluded(est, f"price {option.price_per_hour} above the job's maximum {max_price_per_hour}")
        ranked.append(est)
    ranked.sort(key=lambda e: (bool(e.excluded), math.isinf(e.cost), e.cost, -e.efficiency))
    eligible = [e for e in ranked if not e.excluded]
    if not eligible:
        return PlacementDecision(chosen=None, reason="no eligible placement", ranked=tuple(ranked),
                                 retry_at=min(ends, default=None))
    if all(math.isinf(e.cost) for e in eligible):
        least_bad = max(eligible, key=lambda e: e.efficiency)
        return PlacementDecision(chosen=least_bad.option, ranked=tuple(ranked),
                                 reason="every placement is interrupted more often than the model expects a job to "
                                        "progress at; trying the least-bad one, and learning from its record")
    best = eligible[0]
    if just_preempted and (best.option.provider, best.option.zone) == just_preempted:
        elsewhere = [e for e in eligible if (e.option.provider, e.option.zone) != just_preempted]
        if elsewhere and elsewhere[0].cost <= best.cost * (1 + CLEARLY_BEST_MARGIN):
            return PlacementDecision(chosen=elsewhere[0].option, ranked=tuple(ranked),
                                     reason="cheapest outside the zone that just preempted")
        if elsewhere:
            return PlacementDecision(chosen=best.option, ranked=tuple(ranked),
                                     reason="zone that just preempted is clearly cheapest")
    return PlacementDecision(chosen=best.option, reason="lowest expected cost to finish", ranked=tuple(ranked))


def _excluded(est: Estimate, why: str) -> Estimate:
    return replace(est, excluded=why)


def spot_overhead_fraction(*, rate: RateEstimate, availability: float, restart_s: float,
                           checkpoint_cost_s: float, interval_s: float) -> float:
    """Expected extra wall time per second of work when finishing on spot: the waiting for
    capacity, restarts, lost work and checkpoints. The input of market.deadline_aware."""
    wall = expected_wall_s(work_s=1.0, speed=1.0, rate=rate, restart_s=restart_s,
                           checkpoint_cost_s=checkpoint_cost_s, interval_s=interval_s)
    return wall / max(availability, 1e-9) - 1
