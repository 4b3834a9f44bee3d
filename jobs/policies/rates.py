"""Interruption-rate estimates: a survival estimate with a prior from published buckets.

Lifetimes are exponential survival data: each instance lifetime is exposure, ending
either in an interruption (an event) or censored (completed, cancelled, replaced).
Under a constant hazard the rate's conjugate prior is a Gamma distribution, so the
posterior mean is (prior events + events) / (prior exposure + exposure). The prior
comes from a published interruption-frequency bucket, so a zone we have never run in
is assumed to interrupt as often as its bucket says, not never.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HOURS_PER_MONTH = 730.0

# AWS Spot Instance Advisor "frequency of interruption": share of instances of a type
# interrupted within a month. Representative value per bucket (">20%" has no upper
# bound; 25% is used, the same distance above its edge as the others' midpoints).
FREQUENCY_BUCKETS = {
    "<5%": 0.025,
    "5-10%": 0.075,
    "10-15%": 0.125,
    "15-20%": 0.175,
    ">20%": 0.25,
}
DEFAULT_BUCKET = "10-15%"


@dataclass(frozen=True, kw_only=True, slots=True)
class RatePrior:
    monthly_interruption_fraction: float
    """Share of instances interrupted within a month of running."""
    weight_hours: float = 168.0
    """Pseudo-exposure the prior counts for; a week means a week of data weighs as much."""

    def __post_init__(self):
        if not 0 <= self.monthly_interruption_fraction < 1:
            raise ValueError("monthly_interruption_fraction must be in [0, 1), e.g. 0.125 for 12.5 %")
        if self.weight_hours <= 0:
            raise ValueError("weight_hours must be positive (pseudo-exposure in hours)")

    @classmethod
    def from_bucket(cls, bucket: str = DEFAULT_BUCKET, weight_hours: float = 168.0) -> RatePrior:
        try:
            fraction = FREQUENCY_BUCKETS[bucket]
        except KeyError:
            raise ValueError(f"unknown interruption-frequency bucket {bucket!r}; "
                             f"use one of {', '.join(FREQUENCY_BUCKETS)}") from None
        return cls(monthly_interruption_fraction=fraction, weight_hours=weight_hours)

    @property
    def per_hour(self) -> float:
        # P(interrupted within a month) = 1 - exp(-rate * month)
        return -math.log1p(-self.monthly_interruption_fraction) / HOURS_PER_MONTH


@dataclass(frozen=True, kw_only=True, slots=True)
class Lifetime:
    """One instance's time in a placement, as recorded by the control plane."""

    hours: float
    interrupted: bool
    usable_notice: bool = False
    """The interruption came with a notice in time to commit a checkpoint."""

    def __post_init__(self):
        if self.hours < 0:
            raise ValueError(f"lifetime hours must not be negative (got {self.hours})")
        if self.usable_notice and not self.interrupted:
            raise ValueError("usable_notice only makes sense for an interrupted lifetime")


@dataclass(frozen=True, kw_only=True, slots=True)
class RateEstimate:
    per_hour: float
    """Posterior mean interruption rate."""
    usable_notice_fraction: float
    """Share of interruptions that arrive with a usable notice (posterior mean)."""
    events: int
    exposure_hours: float
    prior_per_hour: float

    @property
    def mtbi_hours(self) -> float:
        return 1 / self.per_hour if self.per_hour > 0 else math.inf

    @property
    def unnoticed_per_hour(self) -> float:
        """Interruptions periodic checkpoints must cover: the ones without a usable notice."""
        return self.per_hour * (1 - self.usable_notice_fraction)


NOTICE_PRIOR_WEIGHT = 2.0
"""Pseudo-interruptions, all assumed without usable notice, so notices must be seen to count."""


def estimate_rate(lifetimes, prior: RatePrior) -> RateEstimate:
    events = noticed = 0
    exposure = 0.0
    for lifetime in lifetimes:
        exposure += lifetime.hours
        events += lifetime.interrupted
        noticed += lifetime.usable_notice
    prior_events = prior.per_hour * prior.weight_hours
    return RateEstimate(
        per_hour=(prior_events + events) / (prior.weight_hours + exposure),
        usable_notice_fraction=noticed / (events + NOTICE_PRIOR_WEIGHT),
        events=events,
        exposure_hours=exposure,
        prior_per_hour=prior.per_hour,
    )


def on_demand_rate() -> RateEstimate:
    """On-demand instances are not reclaimed; their rate is zero, not a prior."""
    return RateEstimate(per_hour=0.0, usable_notice_fraction=0.0, events=0,
                        exposure_hours=0.0, prior_per_hour=0.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class AvailabilityPrior:
    fraction: float = 0.8
    """Share of the time spot capacity is there, before anything is observed: optimistic,
    because the deadline rule's safety net, not this guess, is what protects a deadline."""
    weight_s: float = 2 * 3600.0

    def __post_init__(self):
        if not 0 < self.fraction <= 1 or self.weight_s <= 0:
            raise ValueError("availability prior needs 0 < fraction <= 1 and weight_s > 0")


def estimate_availability(*, available_s: float, observed_s: float,
                          prior: AvailabilityPrior = AvailabilityPrior()) -> float:
    """Share of the time spot could be had (launches succeeded or instances ran), with a prior."""
    if not 0 <= available_s <= observed_s:
        raise ValueError(f"need 0 <= available_s <= observed_s (got {available_s}, {observed_s})")
    return (prior.fraction * prior.weight_s + available_s) / (prior.weight_s + observed_s)
