"""Interruption-rate estimates: a survival estimate that learns within a few events,
starting from a published prior.

Lifetimes are exponential survival data: each instance lifetime is exposure, ending
either in an interruption (an event) or censored (completed, cancelled, replaced).
Under a constant hazard a Gamma prior on the rate is conjugate: after n events in
T hours, Gamma(a, b) becomes Gamma(a + n, b + T).

The prior is a mixture of two Gammas with the same mean, the rate of a published
interruption-frequency bucket (so a zone never run in is assumed to interrupt as
often as its bucket says, not never):

- the bucket's, weighing as much as a week of exposure: right for most placements;
- an open one, weighing minutes: for a placement unlike its bucket.

Each is updated, and reweighted by how well it predicted what was seen (its
marginal likelihood). While the events agree with the bucket, the estimate stays
near it; three preemptions in a few minutes are so unlikely under a rate of one a
month that the open component takes over and the estimate follows the evidence
(about events / exposure). The estimate is the posterior mean, with an
equal-tailed credible interval.
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
    """Pseudo-exposure of the bucket's component; a week means a week of data weighs as much."""
    open_weight_hours: float = 0.05
    """Pseudo-exposure of the open component: evidence of a few minutes outweighs it."""
    open_share: float = 0.1
    """Prior probability that a placement is unlike its bucket."""

    def __post_init__(self):
        if not 0 <= self.monthly_interruption_fraction < 1:
            raise ValueError("monthly_interruption_fraction must be in [0, 1), e.g. 0.125 for 12.5 %")
        if self.weight_hours <= 0 or self.open_weight_hours <= 0:
            raise ValueError("weight_hours and open_weight_hours must be positive (pseudo-exposure in hours)")
        if not 0 <= self.open_share < 1:
            raise ValueError("open_share must be in [0, 1), e.g. 0.1")

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

    def components(self) -> list[tuple[float, float, float]]:
        """(prior probability, shape, rate in hours) of each Gamma of the mixture."""
        mean = self.per_hour
        return [(1 - self.open_share, mean * self.weight_hours, self.weight_hours),
                (self.open_share, mean * self.open_weight_hours, self.open_weight_hours)]


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
    credible_per_hour: tuple[float, float] | None = None
    """The rate's equal-tailed 90 % credible interval, (low, high) per hour; None when not computed."""
    median_per_hour: float | None = None
    """The posterior median: the point estimate people read beside the interval, which it always
    lies inside. The mean (`per_hour`, what expected cost needs) may not: on thin evidence the
    mixture's heavy component pulls it past the interval's top (one event in 6 min: mean 0.24/h,
    90 % interval 0.00035-0.025/h)."""

    @property
    def mtbi_hours(self) -> float:
        return 1 / self.per_hour if self.per_hour > 0 else math.inf

    @property
    def unnoticed_per_hour(self) -> float:
        """Interruptions periodic checkpoints must cover: the ones without a usable notice."""
        return self.per_hour * (1 - self.usable_notice_fraction)


NOTICE_PRIOR_WEIGHT = 2.0
"""Pseudo-interruptions, all assumed without usable notice, so notices must be seen to count."""
CREDIBILITY = 0.9


def estimate_rate(lifetimes, prior: RatePrior) -> RateEstimate:
    events = noticed = 0
    exposure = 0.0
    for lifetime in lifetimes:
        exposure += lifetime.hours
        events += lifetime.interrupted
        noticed += lifetime.usable_notice
    posterior = _posterior(prior, events, exposure)
    tail = (1 - CREDIBILITY) / 2
    return RateEstimate(
        per_hour=math.fsum(w * shape / rate for w, shape, rate in posterior),
        usable_notice_fraction=noticed / (events + NOTICE_PRIOR_WEIGHT),
        events=events,
        exposure_hours=exposure,
        prior_per_hour=prior.per_hour,
        credible_per_hour=(_quantile(posterior, tail), _quantile(posterior, 1 - tail)),
        median_per_hour=_quantile(posterior, 0.5),
    )


def _posterior(prior: RatePrior, events: int, exposure: float) -> list[tuple[float, float, float]]:
    """The mixture after `events` in `exposure` hours: each Gamma updated, each weight
    times the probability its Gamma gave to seeing exactly that (negative binomial)."""
    updated = []
    for weight, shape, rate in prior.components():
        if weight == 0:
            continue
        log_evidence = (math.lgamma(shape + events) - math.lgamma(shape) + shape * math.log(rate / (rate + exposure))
                        - events * math.log(rate + exposure))  # the n!, T^n common to both are left out
        updated.append((math.log(weight) + log_evidence, shape + events, rate + exposure))
    top = max(log_w for log_w, _, _ in updated)
    total = math.fsum(math.exp(log_w - top) for log_w, _, _ in updated)
    return [(math.exp(log_w - top) / total, shape, rate) for log_w, shape, rate in updated]


def _quantile(mixture: list[tuple[float, float, float]], p: float) -> float:
    """The rate below which the mixture puts probability `p` (bisection on its CDF)."""
    def cdf(x: float) -> float:
        return math.fsum(w * _gamma_cdf(shape, rate * x) for w, shape, rate in mixture)

    low, high = 0.0, max(shape / rate for _, shape, rate in mixture) or 1.0
    while cdf(high) < p:
        high *= 2
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if cdf(middle) < p else (low, middle)
    return high


def _gamma_cdf(shape: float, x: float) -> float:
    """The regularized lower incomplete gamma function P(shape, x): a series below
    shape + 1, a continued fraction (modified Lentz) above, as in Numerical Recipes."""
    if x <= 0:
        return 0.0
    log_front = shape * math.log(x) - x - math.lgamma(shape)
    if x < shape + 1:
        term = total = 1 / shape
        n = shape
        while abs(term) > abs(total) * 1e-15:
            n += 1
            term *= x / n
            total += term
        return min(1.0, total * math.exp(log_front))
    tiny = 1e-300
    b = x + 1 - shape
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 1000):
        an = -i * (i - shape)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return max(0.0, 1 - math.exp(log_front) * h)


def on_demand_rate() -> RateEstimate:
    """On-demand instances are not reclaimed; their rate is zero, not a prior."""
    return RateEstimate(per_hour=0.0, usable_notice_fraction=0.0, events=0,
                        exposure_hours=0.0, prior_per_hour=0.0, credible_per_hour=(0.0, 0.0))


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
