"""Checkpoint interval per job: Young/Daly, bounded, with a per-job override.

Young's first-order optimum τ = sqrt(2·C·M) balances the checkpoint cost C against the
work lost to an interruption (τ/2 on average). It overshoots when M is short, which a
rate learned from a burst of preemptions makes it, so the interval is Daly's
higher-order estimate (DESIGN §9): τ = sqrt(2·C·M)·(1 + ⅓·sqrt(C/(2M)) + C/(18M)) − C
for C < 2M, else τ = M. Only interruptions without a usable
notice lose work since the last periodic checkpoint (with a notice the agent saves on
demand), so M is the mean time between *unnoticed* interruptions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from respawn.checkpoint.policy import daly_interval
from respawn_server.jobs.fleet.policies.rates import RateEstimate


@dataclass(frozen=True, kw_only=True, slots=True)
class IntervalBounds:
    minimum_s: float = 60.0
    maximum_s: float = 1200.0

    def __post_init__(self):
        if not 0 < self.minimum_s <= self.maximum_s:
            raise ValueError("checkpoint interval bounds need 0 < minimum_s <= maximum_s "
                             f"(got {self.minimum_s}, {self.maximum_s})")


@dataclass(frozen=True, kw_only=True, slots=True)
class IntervalOverride:
    """A job's own interval; any positive value, in seconds or in steps, never bounded."""

    seconds: float | None = None
    steps: int | None = None

    def __post_init__(self):
        if (self.seconds is None) == (self.steps is None):
            raise ValueError("an interval override gives exactly one of seconds or steps")
        if (self.seconds if self.seconds is not None else self.steps) <= 0:
            raise ValueError("an interval override must be positive")


@dataclass(frozen=True, kw_only=True, slots=True)
class IntervalDecision:
    """The interval and the inputs it came from, as shown on the job page."""

    seconds: float
    source: str
    """'override', 'young_daly', 'minimum' or 'maximum' (a bound won)."""
    checkpoint_cost_s: float
    unnoticed_mtbi_s: float
    young_daly_s: float
    mtbi_s: float | None = None
    """Mean time between interruptions of any kind there (the noticed ones cost only their
    downtime; M above counts the others), so the page can say both."""


def checkpoint_interval(*, checkpoint_cost_s: float, rate: RateEstimate,
                        override: IntervalOverride | None = None, seconds_per_step: float | None = None,
                        bounds: IntervalBounds = IntervalBounds()) -> IntervalDecision:
    if checkpoint_cost_s < 0:
        raise ValueError(f"checkpoint_cost_s must not be negative (got {checkpoint_cost_s})")
    per_hour = rate.unnoticed_per_hour
    mtbi_s = 3600 / per_hour if per_hour > 0 else math.inf
    young_daly = daly_interval(checkpoint_cost_s, mtbi_s)
    inputs = dict(checkpoint_cost_s=checkpoint_cost_s, unnoticed_mtbi_s=mtbi_s, young_daly_s=young_daly,
                  mtbi_s=3600 / rate.per_hour if rate.per_hour > 0 else math.inf)
    if override is not None:
        if override.steps is not None:
            if not seconds_per_step or seconds_per_step <= 0:
                raise ValueError("an override in steps needs the job's measured seconds_per_step")
            return IntervalDecision(seconds=override.steps * seconds_per_step, source="override", **inputs)
        return IntervalDecision(seconds=override.seconds, source="override", **inputs)
    if young_daly < bounds.minimum_s:
        return IntervalDecision(seconds=bounds.minimum_s, source="minimum", **inputs)
    if young_daly > bounds.maximum_s:
        return IntervalDecision(seconds=bounds.maximum_s, source="maximum", **inputs)
    return IntervalDecision(seconds=young_daly, source="young_daly", **inputs)
