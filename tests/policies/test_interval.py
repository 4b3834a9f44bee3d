import math

import pytest

from respawn_server.jobs.fleet.policies.interval import IntervalBounds, IntervalOverride, checkpoint_interval
from respawn_server.jobs.fleet.policies.rates import RateEstimate, on_demand_rate


def rate(per_hour, notice=0.0):
    return RateEstimate(per_hour=per_hour, usable_notice_fraction=notice, events=0,
                        exposure_hours=0, prior_per_hour=per_hour)


def test_daly_worked_example():
    # C = 60 s, one unnoticed interruption every 2 h:
    # sqrt(2 * 60 * 7200) * (1 + sqrt(60 / 14400) / 3 + 60 / 129600) - 60 = 889.95 s
    d = checkpoint_interval(checkpoint_cost_s=60, rate=rate(0.5))
    assert d.source == "young_daly"
    assert d.seconds == pytest.approx(889.95, abs=0.01)
    assert d.unnoticed_mtbi_s == 7200 and d.checkpoint_cost_s == 60


def test_a_checkpoint_costing_two_mtbis_or_more_is_taken_once_per_mtbi():
    # A burst of preemptions learned fast: M = 100 s against C = 60 s. Young's sqrt(2CM)
    # would wait 110 s, past the next expected interruption; Daly's estimate waits 73 s.
    short = checkpoint_interval(checkpoint_cost_s=60, rate=rate(36.0), bounds=IntervalBounds(minimum_s=1))
    assert short.seconds == pytest.approx(73.20, abs=0.01)
    costly = checkpoint_interval(checkpoint_cost_s=250, rate=rate(36.0), bounds=IntervalBounds(minimum_s=1))
    assert costly.seconds == pytest.approx(100.0)


def test_interruptions_with_a_usable_notice_do_not_shorten_the_interval():
    # 1/h, three in four with notice: only 0.25/h must be covered, M = 14400 s
    d = checkpoint_interval(checkpoint_cost_s=30, rate=rate(1.0, notice=0.75))
    assert d.unnoticed_mtbi_s == 14400
    assert d.seconds == pytest.approx(checkpoint_interval(checkpoint_cost_s=30, rate=rate(0.25)).seconds)
    all_noticed = checkpoint_interval(checkpoint_cost_s=30, rate=rate(1.0, notice=1.0))
    assert all_noticed.unnoticed_mtbi_s == math.inf and all_noticed.seconds == 1200


def test_it_is_bounded_to_1_to_20_minutes_by_default():
    assert checkpoint_interval(checkpoint_cost_s=1, rate=rate(6.0)).seconds == 60  # sqrt(2*1*600) = 34.6
    calm = checkpoint_interval(checkpoint_cost_s=60, rate=rate(0.001))
    assert (calm.seconds, calm.source) == (1200, "maximum")
    assert checkpoint_interval(checkpoint_cost_s=60, rate=on_demand_rate()).seconds == 1200
    wide = IntervalBounds(minimum_s=10, maximum_s=7200)
    assert checkpoint_interval(checkpoint_cost_s=60, rate=rate(0.001), bounds=wide).seconds == 7200


def test_a_per_job_override_wins_even_outside_the_bounds():
    d = checkpoint_interval(checkpoint_cost_s=60, rate=rate(0.5), override=IntervalOverride(seconds=5))
    assert (d.seconds, d.source) == (5, "override")
    assert d.young_daly_s == pytest.approx(889.95, abs=0.01)  # inputs still shown
    steps = checkpoint_interval(checkpoint_cost_s=60, rate=rate(0.5), override=IntervalOverride(steps=500),
                                seconds_per_step=0.4)
    assert steps.seconds == 200


def test_it_refuses_ambiguous_or_unusable_overrides():
    with pytest.raises(ValueError, match="exactly one of seconds or steps"):
        IntervalOverride(seconds=10, steps=10)
    with pytest.raises(ValueError, match="must be positive"):
        IntervalOverride(seconds=0)
    with pytest.raises(ValueError, match="needs the job's measured seconds_per_step"):
        checkpoint_interval(checkpoint_cost_s=60, rate=rate(0.5), override=IntervalOverride(steps=10))
    with pytest.raises(ValueError, match="0 < minimum_s <= maximum_s"):
        IntervalBounds(minimum_s=100, maximum_s=10)
