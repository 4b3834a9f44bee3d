"""The spot-market simulator: traces read as documented, capacity refused where a
trace has none, preemption times reproducible from the seed."""

from __future__ import annotations

import json
import statistics

import pytest

from respawn_server.jobs.fleet.providers.local_market import MarketConfig, SpotMarket, Trace, load_trace
from tests.local_provider.helpers import AWS_V100_TRACE as AWS_V100


def write_trace(tmp_path, doc, name="trace.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return str(path)


def test_a_published_trace_reads_with_its_tick_and_values():
    trace = load_trace(AWS_V100)
    with open(AWS_V100) as f:
        doc = json.load(f)
    assert trace.gap_s == doc["metadata"]["gap_seconds"] == 32
    assert list(trace.values) == doc["data"]
    assert trace.source == AWS_V100


@pytest.mark.parametrize(
    "content,complaint",
    [
        ("not json", "not JSON"),
        ({"data": [1, 0]}, "must look like"),
        ({"metadata": {"gap_seconds": "30"}, "data": [1]}, "gap_seconds must be a number"),
        ({"metadata": {"gap_seconds": 0}, "data": [1]}, "gap_seconds must be > 0"),
        ({"metadata": {"gap_seconds": 30}, "data": []}, "no data"),
        ({"metadata": {"gap_seconds": 30}, "data": [1, -1]}, r"data\[1\] must be a non-negative integer"),
        ({"metadata": {"gap_seconds": 30}, "data": [1, "0"]}, r"data\[1\] must be a non-negative integer"),
    ],
)
def test_a_bad_trace_is_refused_naming_the_file_and_the_fault(tmp_path, content, complaint):
    path = write_trace(tmp_path, content)
    with pytest.raises(ValueError, match=complaint) as info:
        load_trace(path)
    assert path in str(info.value)


def test_a_missing_trace_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_trace(str(tmp_path / "nope.json"))


def trace_market(values, *, gap_s=10.0, compression=1.0, zone="z") -> SpotMarket:
    config = MarketConfig(mode="trace", trace_files={zone: "inline"}, time_compression=compression)
    return SpotMarket(config, traces={zone: Trace(gap_s=gap_s, values=tuple(values))})


def test_trace_preempts_at_the_first_later_tick_without_capacity():
    market = trace_market([1, 1, 1, 0, 1, 0])
    # Launched 5 s into tick 0: the first tick with no capacity starts at 30 s.
    assert market.preemption_delay_s("vm", "z", spot=True, launched_at_s=5.0) == 25.0
    # Launched in tick 4: the next zero is tick 5.
    assert market.preemption_delay_s("vm", "z", spot=True, launched_at_s=41.0) == 9.0


def test_trace_wraps_past_its_end_and_a_trace_without_zeros_never_preempts():
    market = trace_market([0, 1, 1])
    # Tick 1 at 15 s: the trace restarts at 30 s, whose tick 0 has no capacity.
    assert market.preemption_delay_s("vm", "z", spot=True, launched_at_s=15.0) == 15.0
    assert trace_market([1, 2, 1]).preemption_delay_s("vm", "z", spot=True, launched_at_s=0.0) is None


def test_time_compression_plays_the_trace_faster():
    market = trace_market([1, 1, 1, 0], gap_s=600.0, compression=600.0)  # one tick per real second
    assert market.preemption_delay_s("vm", "z", spot=True, launched_at_s=0.5) == pytest.approx(2.5)
    assert market.capacity_refusal("z", spot=True, now_s=3.2) != ""
    assert market.capacity_refusal("z", spot=True, now_s=2.9) == ""


def test_a_launch_at_a_tick_without_capacity_is_refused_for_spot_only():
    market = trace_market([1, 0])
    refusal = market.capacity_refusal("z", spot=True, now_s=12.0)
    assert "no spot capacity in zone z" in refusal and "tick 1" in refusal
    assert market.capacity_refusal("z", spot=False, now_s=12.0) == ""
    assert market.capacity_refusal("z", spot=True, now_s=2.0) == ""


def test_zones_configured_out_of_capacity_refuse_every_market():
    market = SpotMarket(MarketConfig(mode="none", out_of_capacity_zones={"local-b"}))
    assert "local-b is out of capacity" in market.capacity_refusal("local-b", spot=True, now_s=0)
    assert "local-b is out of capacity" in market.capacity_refusal("local-b", spot=False, now_s=0)
    assert market.capacity_refusal("local-a", spot=True, now_s=0) == ""


def test_a_zone_without_a_trace_is_an_error_naming_it():
    market = trace_market([1], zone="local-a")
    with pytest.raises(ValueError, match="no spot trace for zone 'local-c'"):
        market.capacity_refusal("local-c", spot=True, now_s=0)


def test_the_star_trace_covers_every_other_zone(tmp_path):
    path = write_trace(tmp_path, {"metadata": {"gap_seconds": 5}, "data": [1, 1, 0]})
    market = SpotMarket(MarketConfig(mode="trace", trace_files={"*": path}))
    assert market.preemption_delay_s("vm", "anywhere", spot=True, launched_at_s=1.0) == 9.0


def test_every_mode_is_a_fixed_delay_and_on_demand_is_never_preempted():
    market = SpotMarket(MarketConfig(mode="every", every_s=7.5))
    assert [market.preemption_delay_s(f"vm{i}", "z", spot=True, launched_at_s=i) for i in range(3)] == [7.5] * 3
    assert market.preemption_delay_s("vm", "z", spot=False, launched_at_s=0) is None
    assert SpotMarket(MarketConfig(mode="none")).preemption_delay_s("vm", "z", spot=True, launched_at_s=0) is None


def test_a_limited_market_preempts_only_the_first_spot_vms_in_any_mode():
    every = SpotMarket(MarketConfig(mode="every", every_s=7.5, max_preemptions=2))
    assert [every.preemption_delay_s("vm", "z", spot=True, launched_at_s=0, preempted_before=n) for n in range(4)] == [7.5, 7.5, None, None]
    rate = SpotMarket(MarketConfig(mode="rate", rate_per_hour=60.0, max_preemptions=0))
    assert rate.preemption_delay_s("vm", "z", spot=True, launched_at_s=0) is None


def rate_delays(seed: int, keys, rate_per_hour=6.0, compression=1.0) -> list[float]:
    market = SpotMarket(MarketConfig(mode="rate", rate_per_hour=rate_per_hour, seed=seed, time_compression=compression))
    return [market.preemption_delay_s(key, "z", spot=True, launched_at_s=0) for key in keys]


def test_rate_mode_is_reproducible_from_the_seed_whatever_the_launch_order():
    keys = [f"local-{i}-0000000{i % 10}" for i in range(50)]
    forward = rate_delays(7, keys)
    backward = rate_delays(7, list(reversed(keys)))
    assert forward == list(reversed(backward))
    assert rate_delays(8, keys) != forward
    assert len(set(forward)) == len(forward)


def test_rate_mode_draws_with_the_configured_mean_in_market_time():
    keys = [f"vm-{i}" for i in range(4000)]
    # 6 per hour: mean 600 s; compressed 60x: 10 real seconds.
    assert statistics.mean(rate_delays(1, keys)) == pytest.approx(600.0, rel=0.06)
    assert statistics.mean(rate_delays(1, keys, compression=60.0)) == pytest.approx(10.0, rel=0.06)


@pytest.mark.parametrize(
    "fields,complaint",
    [
        (dict(mode="sometimes"), "mode 'sometimes' is not one of"),
        (dict(mode="trace"), "needs trace_files"),
        (dict(mode="every", every_s=0), "every_s must be > 0"),
        (dict(mode="rate", rate_per_hour=-1), "rate_per_hour must be > 0"),
        (dict(time_compression=0), "time_compression must be > 0"),
        (dict(max_preemptions=-1), "max_preemptions must be >= 0"),
    ],
)
def test_bad_market_settings_are_refused_with_the_field_named(fields, complaint):
    with pytest.raises(ValueError, match=complaint):
        MarketConfig(**fields)
