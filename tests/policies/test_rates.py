import random

import pytest

from respawn_server.jobs.fleet.policies.rates import (AvailabilityPrior, Lifetime, RatePrior, estimate_availability, estimate_rate,
                                       on_demand_rate)


def synthetic_lifetimes(rate_per_hour, n, *, seed, censor_after_hours=24.0, notice_share=0.0):
    """Exponential lifetimes; instances still alive after `censor_after_hours` end without an event."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        life = rng.expovariate(rate_per_hour)
        if life >= censor_after_hours:
            out.append(Lifetime(hours=censor_after_hours, interrupted=False))
        else:
            out.append(Lifetime(hours=life, interrupted=True, usable_notice=rng.random() < notice_share))
    return out


@pytest.mark.parametrize("true_rate", [0.01, 0.05, 0.3])
def test_it_recovers_a_known_rate_from_censored_lifetimes(true_rate):
    est = estimate_rate(synthetic_lifetimes(true_rate, 4000, seed=7), RatePrior.from_bucket("10-15%"))
    assert est.per_hour == pytest.approx(true_rate, rel=0.1)
    assert est.mtbi_hours == pytest.approx(1 / true_rate, rel=0.1)


def test_it_recovers_the_share_of_interruptions_with_a_usable_notice():
    est = estimate_rate(synthetic_lifetimes(0.2, 3000, seed=3, notice_share=0.7), RatePrior.from_bucket())
    assert est.usable_notice_fraction == pytest.approx(0.7, abs=0.05)
    assert est.unnoticed_per_hour == pytest.approx(0.2 * 0.3, rel=0.15)


def test_a_new_zone_gets_its_bucket_rate_not_zero():
    prior = RatePrior.from_bucket(">20%")
    est = estimate_rate([], prior)
    assert est.per_hour == prior.per_hour > 0
    # 25 % of instances interrupted within a 730-hour month
    assert 1 - (1 - est.per_hour) ** 730 == pytest.approx(0.25, abs=0.01)
    assert est.usable_notice_fraction == 0  # notices must be seen before they count


def test_three_preemptions_in_two_minutes_move_the_estimate_to_their_rate():
    # Three 40-second lifetimes, each ended by a preemption: about 90 an hour.
    est = estimate_rate([Lifetime(hours=40 / 3600, interrupted=True)] * 3, RatePrior.from_bucket())
    assert 30 < est.per_hour < 150
    low, high = est.credible_per_hour
    assert low < est.per_hour < high and low > 5  # certainly not one a month any more
    assert est.mtbi_hours * 3600 < 120


def test_events_in_line_with_the_bucket_move_it_only_a_little():
    prior = RatePrior.from_bucket("<5%")
    calm = estimate_rate([Lifetime(hours=500, interrupted=False), Lifetime(hours=300, interrupted=True)], prior)
    assert prior.per_hour < calm.per_hour < 0.01


def test_the_credible_interval_narrows_as_evidence_comes_in():
    prior = RatePrior.from_bucket()
    widths = []
    for n in (3, 30, 300):
        est = estimate_rate([Lifetime(hours=10, interrupted=True)] * n, prior)
        low, high = est.credible_per_hour
        assert low < est.per_hour < high
        widths.append((high - low) / est.per_hour)
    assert widths[0] > widths[1] > widths[2]
    assert estimate_rate([Lifetime(hours=10, interrupted=True)] * 300, prior).per_hour == pytest.approx(0.1, rel=0.05)


def test_it_refuses_unknown_buckets_and_impossible_lifetimes():
    with pytest.raises(ValueError, match="unknown interruption-frequency bucket '7%'"):
        RatePrior.from_bucket("7%")
    with pytest.raises(ValueError, match="must not be negative"):
        Lifetime(hours=-1, interrupted=False)
    with pytest.raises(ValueError, match="usable_notice only makes sense"):
        Lifetime(hours=1, interrupted=False, usable_notice=True)


def test_on_demand_is_never_interrupted_and_availability_blends_its_prior():
    assert on_demand_rate().per_hour == 0
    assert estimate_availability(available_s=0, observed_s=0) == AvailabilityPrior().fraction
    many = estimate_availability(available_s=30 * 86400 * 0.25, observed_s=30 * 86400)
    assert many == pytest.approx(0.25, abs=0.01)
    with pytest.raises(ValueError, match="available_s <= observed_s"):
        estimate_availability(available_s=2, observed_s=1)


def test_the_point_estimate_people_read_lies_inside_its_interval_however_thin_the_evidence():
    prior = RatePrior.from_bucket()
    for events in range(6):
        for hours in (0.01, 0.03, 0.1, 0.3, 1, 3, 10, 100, 1000):
            lives = ([Lifetime(hours=hours / events, interrupted=True)] * events if events
                     else [Lifetime(hours=hours, interrupted=False)])
            est = estimate_rate(lives, prior)
            low, high = est.credible_per_hour
            assert low <= est.median_per_hour <= high, (events, hours, est)
    # The figures: one interruption in 6 minutes. The mean, for expected cost, is past the interval.
    thin = estimate_rate([Lifetime(hours=0.1, interrupted=True)], prior)
    assert thin.per_hour > thin.credible_per_hour[1]
