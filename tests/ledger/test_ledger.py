"""The ledger against an independent per-second sum (DESIGN.md §8)."""

import datetime as dt
from collections import defaultdict
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from respawn_server.jobs.money.ledger import HOURS_PER_MONTH, MONEY_QUANTUM, InstanceInterval, LedgerError, build_ledger
from respawn_server.jobs.money.prices import DiskQuote, Quote

UTC = dt.UTC
KEY = dict(provider="aws", region="us-east-1", instance_type="p3.2xlarge")


def quote(price, at, *, zone="us-east-1a", market="spot", itype="p3.2xlarge"):
    return Quote(provider="aws", region="us-east-1", zone=zone, instance_type=itype,
                 market=market, usd_per_hour=Decimal(price), observed_at=at)


def disk_quote(price, at, *, sku="P10 LRS"):
    return DiskQuote(provider="aws", region="us-east-1", sku=sku, usd_per_month=Decimal(price), observed_at=at)


def instance(start, end, *, name="i-1", zone="us-east-1a", market="spot", itype="p3.2xlarge", **work):
    return InstanceInterval(instance_id=name, provider="aws", region="us-east-1", zone=zone,
                            instance_type=itype, market=market, start=start, end=end, **work)


# ---- the independent reference: one price look-up per billed second ----

def brute_force(intervals, quotes, now):
    """Walk every second; the price is a linear scan over all quotes. Slow on purpose.
    A stopped disk's second costs its monthly price / HOURS_PER_MONTH per hour."""
    def latest(matching, moment):
        seen = [q for q in quotes if matching(q) and q.observed_at <= moment]
        return max(seen, key=lambda q: q.observed_at) if seen else None

    def price_at(moment, iv, market):
        def in_zone(zone):
            found = latest(lambda q: isinstance(q, Quote) and (q.provider, q.region, q.zone, q.instance_type,
                           q.market) == (iv.provider, iv.region, zone, iv.instance_type, market), moment)
            return found.usd_per_hour if found else None
        zoned = in_zone(iv.zone) if iv.zone else None
        return zoned if zoned is not None else in_zone("")

    def disk_price_at(moment, iv):
        found = latest(lambda q: isinstance(q, DiskQuote) and (q.provider, q.region, q.sku)
                       == (iv.provider, iv.region, iv.stopped_disk), moment)
        assert found is not None
        return found.usd_per_month / HOURS_PER_MONTH

    spent, months, baseline, waste = Decimal(0), defaultdict(Decimal), Decimal(0), Decimal(0)
    for iv in intervals:
        start = iv.start.replace(microsecond=0)
        end = (iv.end or now).replace(microsecond=0)
        paid, seconds = Decimal(0), 0
        moment = start
        while moment < end:
            p = price_at(moment, iv, iv.market)
            assert p is not None
            paid += p
            months[moment.strftime("%Y-%m")] += p
            seconds += 1
            moment += dt.timedelta(seconds=1)
        spent += paid / 3600
        if iv.steps_kept:
            baseline += iv.steps_kept * iv.seconds_per_step * price_at(start, iv, "on_demand") / 3600
        if seconds:
            wasted_s = iv.recomputed_steps * iv.seconds_per_step + iv.boot_restore_seconds \
                + iv.checkpoint_stall_seconds
            waste += wasted_s * paid / seconds / 3600
        if iv.stopped_disk:  # after the end, up to the release (or now)
            moment, released = end, (iv.disk_released or now).replace(microsecond=0)
            while moment < released:
                p = disk_price_at(moment, iv)
                spent += p / 3600
                waste += p / 3600
                months[moment.strftime("%Y-%m")] += p
                moment += dt.timedelta(seconds=1)
    return spent, {m: v / 3600 for m, v in months.items()}, baseline, waste


def close(a, b, n_terms=8):
    return abs(a - b) <= MONEY_QUANTUM * n_terms


# ---- generated histories ----

MONTH_EDGES = [dt.datetime(2026, 1, 31, 23, 0, tzinfo=UTC), dt.datetime(2026, 12, 31, 22, 30, tzinfo=UTC),
               dt.datetime(2028, 2, 29, 23, 15, tzinfo=UTC)]
ZONES = ["us-east-1a", "us-east-1b"]
TYPES = ["p3.2xlarge", "g5.xlarge"]
prices = st.decimals(min_value=Decimal("0.0001"), max_value=Decimal("40"), places=4)
DISK_SKUS = ["P10 LRS", "E10 LRS"]
disk_prices = st.decimals(min_value=Decimal("0.01"), max_value=Decimal("900"), places=2)


@st.composite
def histories(draw):
    base = draw(st.sampled_from(MONTH_EDGES))
    horizon = 4 * 3600

    def moment(lo=0, hi=horizon):
        return base + dt.timedelta(seconds=draw(st.integers(lo, hi)),
                                   microseconds=draw(st.sampled_from([0, 0, 1, 500_000, 999_999])))

    quotes = []
    for itype in TYPES:
        # an on-demand and a region-wide spot price in force from the start ...
        quotes.append(quote(draw(prices), base - dt.timedelta(days=1), zone="", market="on_demand", itype=itype))
        quotes.append(quote(draw(prices), base - dt.timedelta(days=1), zone="", itype=itype))
        # ... then price changes, some zone-specific, landing mid-instance
        for _ in range(draw(st.integers(0, 4))):
            quotes.append(quote(draw(prices), moment(), zone=draw(st.sampled_from(ZONES + [""])),
                                market=draw(st.sampled_from(["spot", "spot", "on_demand"])), itype=itype))
    for sku in DISK_SKUS:  # a monthly disk price in force from the start, then changes
        quotes.append(disk_quote(draw(disk_prices), base - dt.timedelta(days=1), sku=sku))
        for _ in range(draw(st.integers(0, 3))):
            quotes.append(disk_quote(draw(disk_prices), moment(hi=2 * horizon), sku=sku))
    # two different prices for one key at one instant are refused (tested below), so keep one
    quotes = list({(q.key(), q.observed_at): q for q in reversed(quotes)}.values())
    intervals, cursor, last_release = [], 0, base
    for n in range(draw(st.integers(1, 4))):  # relaunches, possibly on another type/zone/market
        start_s = cursor + draw(st.integers(0, 1800))
        length = draw(st.integers(0, 5400))
        running = draw(st.integers(0, 5)) == 0
        start = base + dt.timedelta(seconds=start_s, microseconds=draw(st.sampled_from([0, 250_000])))
        end = None if running else start + dt.timedelta(seconds=length, microseconds=draw(st.sampled_from([0, 700_000])))
        # evicted, its VM stopped with a billed disk: released later (or not yet: billed to now)
        disk = {} if running or draw(st.integers(0, 2)) == 0 else {"stopped_disk": draw(st.sampled_from(DISK_SKUS))}
        if disk and draw(st.booleans()):
            disk["disk_released"] = end + dt.timedelta(seconds=draw(st.integers(0, 3 * 3600)),
                                                       microseconds=draw(st.sampled_from([0, 300_000])))
            last_release = max(last_release, disk["disk_released"])
        intervals.append(instance(
            start, end, name=f"i-{n}", zone=draw(st.sampled_from(ZONES)),
            market=draw(st.sampled_from(["spot", "on_demand"])), itype=draw(st.sampled_from(TYPES)),
            steps_kept=draw(st.integers(0, 500)), seconds_per_step=draw(st.decimals(0, 5, places=2)),
            boot_restore_seconds=Decimal(draw(st.integers(0, 400))),
            checkpoint_stall_seconds=Decimal(draw(st.integers(0, 100))),
            recomputed_steps=draw(st.integers(0, 50)), **disk))
        cursor = start_s + (0 if running else length) + 1
    now = max(base + dt.timedelta(seconds=cursor), last_release) + dt.timedelta(seconds=draw(st.integers(0, 3600)))
    return intervals, quotes, now


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories())
def test_it_matches_a_per_second_sum_of_the_price_in_force(history):
    intervals, quotes, now = history
    ledger = build_ledger(intervals, quotes, now)
    spent, months, baseline, waste = brute_force(intervals, quotes, now)
    n = len(intervals)  # each instance's VM and stopped disk are rounded apart: two terms each
    assert close(ledger.spent, spent, 2 * n)
    assert set(months) <= set(ledger.by_month)
    for month, value in months.items():
        assert close(ledger.by_month[month].spent, value, 2 * n)
    assert close(ledger.baseline, baseline, n)
    assert close(ledger.waste.total, waste, 4 * n)
    # identities, as an extra check only
    assert close(ledger.savings, ledger.baseline - ledger.spent, 0)
    assert close(sum(m.spent for m in ledger.by_month.values()), ledger.spent, 4 * n)
    assert close(sum(m.baseline for m in ledger.by_month.values()), ledger.baseline, 4 * n)
    assert close(sum(m.waste for m in ledger.by_month.values()), ledger.waste.total, 6 * n)
    assert ledger.waste.stopped_disk == sum((c.waste.stopped_disk for c in ledger.instances), Decimal(0))


# ---- worked examples and refusals ----

def test_a_stopped_disk_bills_from_the_end_to_its_release_across_a_month_and_a_price_change():
    t0 = dt.datetime(2026, 1, 31, 22, 0, tzinfo=UTC)
    quotes = [quote("1.00", t0 - dt.timedelta(days=1)), disk_quote("73.00", t0 - dt.timedelta(days=1)),
              disk_quote("146.00", t0 + dt.timedelta(hours=3))]  # 0.10 $/h, then 0.20 $/h
    evicted = instance(t0, t0 + dt.timedelta(hours=1), stopped_disk="P10 LRS",
                       disk_released=t0 + dt.timedelta(hours=4))
    ledger = build_ledger([evicted], quotes, now=t0 + dt.timedelta(days=1))
    assert ledger.waste.stopped_disk == Decimal("0.40")  # 23:00-01:00 at 0.10 + 01:00-02:00 at 0.20
    assert ledger.spent == Decimal("1.40")
    assert ledger.by_month["2026-01"].spent == Decimal("1.10")  # the VM's hour + the disk's first hour
    assert ledger.by_month["2026-02"].waste == Decimal("0.30")
    assert ledger.instances[0].stopped_disk_seconds == 3 * 3600
    assert ledger.instances[0].billed_seconds == 3600, "a disk's seconds are not the VM's (GPU-hours)"

    still_stopped = instance(t0, t0 + dt.timedelta(hours=1), stopped_disk="P10 LRS")
    open_ledger = build_ledger([still_stopped], quotes, now=t0 + dt.timedelta(hours=2))
    assert open_ledger.waste.stopped_disk == Decimal("0.10"), "billed up to now while not released"


def test_it_refuses_a_stopped_disk_without_an_end_or_released_before_it():
    t0 = dt.datetime(2026, 3, 1, tzinfo=UTC)
    with pytest.raises(LedgerError, match="instance i-1: a stopped disk bills after the end, but it has none"):
        instance(t0, None, stopped_disk="P10 LRS")
    with pytest.raises(LedgerError, match="instance i-1: disk_released .* is before end"):
        instance(t0, t0 + dt.timedelta(hours=1), stopped_disk="P10 LRS", disk_released=t0)
    with pytest.raises(LedgerError, match="instance i-1's stopped disk: no disk price for aws/us-east-1/\\*/P10 LRS"):
        build_ledger([instance(t0, t0 + dt.timedelta(hours=1), stopped_disk="P10 LRS")],
                     [quote("1", t0)], now=t0 + dt.timedelta(hours=2))


def test_it_splits_at_the_month_boundary_and_follows_a_mid_instance_price_change():
    t0 = dt.datetime(2026, 1, 31, 23, 0, tzinfo=UTC)
    quotes = [quote("1.00", t0 - dt.timedelta(hours=1)),
              quote("2.00", t0 + dt.timedelta(minutes=90)),
              quote("3.00", t0, zone="", market="on_demand")]
    iv = instance(t0, t0 + dt.timedelta(hours=2), steps_kept=3600, seconds_per_step=Decimal(1),
                  boot_restore_seconds=Decimal(360))
    ledger = build_ledger([iv], quotes, now=t0 + dt.timedelta(days=1))
    assert ledger.by_month["2026-01"].spent == Decimal("1.00")
    assert ledger.by_month["2026-02"].spent == Decimal("1.50")  # 30 min at 1.00 + 30 min at 2.00
    assert ledger.spent == Decimal("2.50")
    assert ledger.baseline == Decimal("3.00")  # one hour of kept work at on-demand
    assert ledger.savings == Decimal("0.50")
    assert ledger.waste.boot_restore == Decimal("0.125")  # 6 min at the 1.25/h average paid


def test_a_zone_quote_beats_a_newer_region_quote_and_a_running_instance_is_billed_to_now():
    t0 = dt.datetime(2026, 3, 1, tzinfo=UTC)
    quotes = [quote("9.00", t0, zone=""), quote("1.00", t0, zone="us-east-1a"),
              quote("5.00", t0 + dt.timedelta(minutes=10), zone="")]
    a = instance(t0, None, name="a", zone="us-east-1a")
    b = instance(t0, None, name="b", zone="us-east-1b")
    ledger = build_ledger([a, b], quotes, now=t0 + dt.timedelta(minutes=30))
    assert [c.spent for c in ledger.instances] == [Decimal("0.50"), Decimal("3.16666667")]  # b: 10 min at 9.00, 20 at 5.00


def test_it_refuses_a_moment_without_a_price_naming_the_instance():
    t0 = dt.datetime(2026, 3, 1, tzinfo=UTC)
    with pytest.raises(LedgerError, match="instance i-1: no spot price .* in force at 2026-03-01 00:00:00"):
        build_ledger([instance(t0, t0 + dt.timedelta(hours=1))],
                     [quote("1", t0 + dt.timedelta(minutes=5))], now=t0)


def test_it_refuses_two_different_prices_for_the_same_key_and_instant():
    t0 = dt.datetime(2026, 3, 1, tzinfo=UTC)
    with pytest.raises(LedgerError, match="two quotes for .*us-east-1a.* disagree \\(1 vs 2\\)"):
        build_ledger([], [quote("1", t0), quote("2", t0)], now=t0)


def test_it_refuses_naive_times_and_backwards_intervals():
    t0 = dt.datetime(2026, 3, 1, tzinfo=UTC)
    with pytest.raises(LedgerError, match="instance i-1 start must be a timezone-aware"):
        instance(t0.replace(tzinfo=None), None)
    with pytest.raises(LedgerError, match="instance i-1: end .* is before start"):
        instance(t0, t0 - dt.timedelta(seconds=1))
    with pytest.raises(LedgerError, match="now .* is before its start"):
        build_ledger([instance(t0, None)], [quote("1", t0)], now=t0 - dt.timedelta(hours=1))
