import datetime as dt

import pytest

from respawn_server.jobs.fleet.policies.expected_cost import Option, PlacementEvent, backoff_until, choose_placement, expected_wall_s
from respawn_server.jobs.fleet.policies.rates import RateEstimate, on_demand_rate

HOUR = 3600.0


def rate(per_hour):
    return RateEstimate(per_hour=per_hour, usable_notice_fraction=0.0, events=0, exposure_hours=0,
                        prior_per_hour=per_hour)


def option(zone, market="spot", price=1.0, per_hour=0.05, itype="p3.2xlarge", speed=1.0):
    return Option(provider="aws", region=zone[:-1], zone=zone, instance_type=itype, market=market,
                  price_per_hour=price, rate=rate(per_hour) if market == "spot" else on_demand_rate(),
                  speed=speed)


TABLE = [
    option("us-east-1a", price=0.95, per_hour=0.02),
    option("us-east-1b", price=0.90, per_hour=0.50),   # cheapest sticker, reclaimed twice an hour
    option("us-east-1c", price=1.00, per_hour=0.01),
    option("us-east-1a", market="on_demand", price=3.06),
]
PLAN = dict(work_s=20 * HOUR, now=1000 * HOUR, restart_s=360, checkpoint_cost_s=60)


def test_it_picks_the_lowest_expected_cost_to_finish_not_the_lowest_sticker_price():
    decision = choose_placement(TABLE, **PLAN)
    assert decision.chosen.zone == "us-east-1a"
    by_zone = {(e.option.zone, e.option.market): e for e in decision.ranked}
    # the cheap but flaky zone loses its discount to restarts and lost work
    assert by_zone[("us-east-1b", "spot")].cost > by_zone[("us-east-1a", "spot")].cost
    assert by_zone[("us-east-1a", "on_demand")].wall_s == pytest.approx(20 * HOUR * (1 + 60 / 1200) + 360)


def test_a_faster_type_can_be_cheaper_per_job_despite_a_higher_hourly_price():
    slow = option("us-east-1a", price=1.0, per_hour=0.02)
    fast = option("us-east-1a", price=1.5, per_hour=0.02, itype="p4d", speed=2.0)
    assert choose_placement([slow, fast], **PLAN).chosen.instance_type == "p4d"


def test_on_demand_wins_when_spot_is_interrupted_too_often_to_progress():
    hopeless = option("us-east-1a", price=0.3, per_hour=10.0)  # a restart every 6 min
    assert expected_wall_s(work_s=HOUR, speed=1, rate=hopeless.rate, restart_s=360, checkpoint_cost_s=60,
                           interval_s=60) == float("inf")
    decision = choose_placement([hopeless, option("us-east-1a", market="on_demand", price=3.06)], **PLAN)
    assert decision.chosen.market == "on_demand"
    assert decision.ranked[-1].option == hopeless and decision.ranked[-1].cost == float("inf")


def test_where_the_model_finds_every_placement_hopeless_the_least_bad_is_still_tried():
    # The demo's market: a VM reclaimed every 2 minutes, and the prior's 6-minute restart.
    every_2_min = [option("us-east-1a", price=0.3, per_hour=30.0), option("us-east-1b", price=0.3, per_hour=40.0)]
    decision = choose_placement(every_2_min, **PLAN)
    assert decision.chosen.zone == "us-east-1a"
    assert "least-bad" in decision.reason


def test_the_jobs_own_record_on_a_market_wins_over_the_model():
    # Reclaimed every 2 minutes, but each notice save committed: the job kept 70 % of its VMs' time.
    kept = Option(**{**{f: getattr(option("us-east-1a"), f) for f in Option.__slots__}, "rate": rate(30.0),
                     "price_per_hour": 0.3, "kept_fraction": 0.7})
    decision = choose_placement([kept, option("us-east-1a", market="on_demand", price=1.0)], **PLAN)
    assert decision.chosen.market == "spot"
    assert decision.ranked[0].wall_s == pytest.approx(PLAN["work_s"] / 0.7)


def test_preemptions_whose_notice_save_committed_put_nothing_on_back_off():
    key, now = TABLE[0].key, PLAN["now"]
    saved = [PlacementEvent(key=key, kind="preempted", at=now - 60 * m, saved=True) for m in (1, 3, 5, 7)]
    assert backoff_until(saved, key, now) is None
    lost = [PlacementEvent(key=key, kind="preempted", at=now - 60 * m) for m in (1, 3, 5)]
    assert backoff_until(lost, key, now) == now - 60 + 1800


def test_a_job_held_by_back_off_is_told_when_it_ends():
    now = PLAN["now"]
    events = [PlacementEvent(key=o.key, kind="capacity_error", at=now - 60 * n) for n, o in enumerate(TABLE)]
    decision = choose_placement(TABLE, events=events, **PLAN)
    assert decision.chosen is None
    assert decision.retry_at == now - 60 * 3 + 300  # the oldest error's back-off ends first


def test_a_capacity_error_puts_a_placement_on_back_off_that_doubles_and_expires():
    key = TABLE[0].key
    now = PLAN["now"]
    first = [PlacementEvent(key=key, kind="capacity_error", at=now - 60)]
    assert backoff_until(first, key, now) == now - 60 + 300
    decision = choose_placement(TABLE, events=first, **PLAN)
    assert decision.chosen.zone == "us-east-1c"
    # Said for people: how long, and when in UTC, never a raw Unix time.
    until = dt.datetime.fromtimestamp(now - 60 + 300, dt.UTC)
    assert decision.ranked[-1].excluded == f"on back-off for 4 min more (until {until:%Y-%m-%d %H:%M} UTC)"
    second = first + [PlacementEvent(key=key, kind="capacity_error", at=now - 30)]
    assert backoff_until(second, key, now) == now - 30 + 600
    assert backoff_until(first, key, now + 400) is None
    assert choose_placement(TABLE, events=first, **{**PLAN, "now": now + 400}).chosen.zone == "us-east-1a"


def test_a_burst_of_preemptions_puts_a_placement_aside():
    key, now = TABLE[0].key, PLAN["now"]
    burst = [PlacementEvent(key=key, kind="preempted", at=now - m * 60) for m in (50, 30, 10)]
    assert backoff_until(burst[:2], key, now) is None
    assert backoff_until(burst, key, now) == now - 600 + 1800
    assert choose_placement(TABLE, events=burst, **PLAN).chosen.zone == "us-east-1c"


def test_a_relaunch_avoids_the_zone_that_just_preempted_unless_it_is_clearly_best():
    decision = choose_placement(TABLE, just_preempted=("aws", "us-east-1a"), **PLAN)
    assert decision.chosen.zone == "us-east-1c"
    assert decision.reason == "cheapest outside the zone that just preempted"
    clearly = [option("us-east-1a", price=0.5, per_hour=0.02), option("us-east-1c", price=1.0, per_hour=0.01)]
    decision = choose_placement(clearly, just_preempted=("aws", "us-east-1a"), **PLAN)
    assert decision.chosen.zone == "us-east-1a"
    assert decision.reason == "zone that just preempted is clearly cheapest"


def test_the_jobs_price_cap_and_an_empty_table_give_no_placement_with_a_reason():
    decision = choose_placement(TABLE, max_price_per_hour=0.5, **PLAN)
    assert decision.chosen is None and decision.reason == "no eligible placement"
    assert all("above the job's maximum" in e.excluded for e in decision.ranked)
