"""The periodic interval is DESIGN §9's Daly higher-order estimate, checked against the
formula written out here in another algebraic form, over random costs and rates:

    τ = sqrt(2CM)·(1 + ⅓·sqrt(C/(2M)) + C/(18M)) − C
      = sqrt(2CM) − ⅔·C + (C/18)·sqrt(2C/M)        (since sqrt(2CM)·⅓·sqrt(C/(2M)) = C/3)

for C < 2M, else τ = M; bounded to [1 min, 20 min] unless the job's own interval wins."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from respawn_server.jobs.fleet.policies.interval import IntervalBounds, IntervalOverride, checkpoint_interval
from respawn_server.jobs.fleet.policies.rates import RateEstimate

COSTS = st.floats(min_value=0.01, max_value=3600, allow_nan=False)
MTBIS = st.floats(min_value=1.0, max_value=10 * 86400, allow_nan=False)
UNBOUNDED = IntervalBounds(minimum_s=1e-9, maximum_s=1e12)


def rate_for(mtbi_s: float) -> RateEstimate:
    per_hour = 3600 / mtbi_s
    return RateEstimate(per_hour=per_hour, usable_notice_fraction=0.0, events=0, exposure_hours=0, prior_per_hour=per_hour)


def daly(c: float, m: float) -> float:
    if c >= 2 * m:
        return m
    return math.sqrt(2 * c * m) - 2 * c / 3 + (c / 18) * math.sqrt(2 * c / m)


@given(COSTS, MTBIS)
def test_the_unbounded_interval_is_dalys_higher_order_estimate(c, m):
    decision = checkpoint_interval(checkpoint_cost_s=c, rate=rate_for(m), bounds=UNBOUNDED)
    assert decision.unnoticed_mtbi_s == pytest.approx(m, rel=1e-12)
    assert decision.young_daly_s == pytest.approx(daly(c, m), rel=1e-9, abs=1e-9)
    assert decision.seconds == decision.young_daly_s


@given(COSTS, MTBIS)
def test_by_default_it_is_dalys_estimate_held_to_1_to_20_minutes(c, m):
    decision = checkpoint_interval(checkpoint_cost_s=c, rate=rate_for(m))
    assert decision.seconds == pytest.approx(min(max(daly(c, m), 60.0), 1200.0), rel=1e-9)
    assert decision.source in ("minimum", "maximum", "young_daly")
    if decision.source == "young_daly":
        assert 60 <= decision.seconds <= 1200


@given(COSTS, MTBIS, st.floats(min_value=0.001, max_value=1e6, allow_nan=False))
def test_a_jobs_own_interval_wins_whatever_the_estimate(c, m, own):
    decision = checkpoint_interval(checkpoint_cost_s=c, rate=rate_for(m), override=IntervalOverride(seconds=own))
    assert (decision.seconds, decision.source) == (own, "override")
    assert decision.young_daly_s == pytest.approx(daly(c, m), rel=1e-9, abs=1e-9)
