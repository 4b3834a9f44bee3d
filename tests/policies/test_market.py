import dataclasses
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from respawn_server.jobs.fleet.policies import market
from respawn_server.jobs.fleet.policies.market import ON_DEMAND, SPOT, JobClock, deadline_aware, greedy, uniform_progress

HOUR = 3600.0


def clock(**changes):
    base = JobClock(now=10 * HOUR, started_at=0.0, deadline=200 * HOUR, total_work_s=100 * HOUR,
                    remaining_work_s=95 * HOUR, unsaved_work_s=0.0, running=None, spot_available=False,
                    restart_s=360.0, checkpoint_cost_s=60.0, on_demand_interval_s=1200.0,
                    decision_period_s=300.0)
    return dataclasses.replace(base, **changes)


def test_the_safety_net_sends_every_rule_to_on_demand_when_slack_runs_out():
    # 95 h of work, 99.8 h left: on-demand needs 95 * 1.05 h + restart + one checkpoint = 99.9 h
    tight = clock(now=100.2 * HOUR, running=SPOT, spot_available=True)
    assert market.safety_net(tight)
    for rule in (greedy, uniform_progress, lambda c: deadline_aware(c, spot_overhead_fraction=0.0)):
        assert rule(tight) == ON_DEMAND
    # unsaved spot work counts as lost when judging the worst case
    assert not market.safety_net(clock(now=90 * HOUR, running=SPOT))
    assert market.safety_net(clock(now=90 * HOUR, running=SPOT, unsaved_work_s=10 * HOUR))


def test_greedy_waits_for_spot_and_never_leaves_on_demand():
    assert greedy(clock()) is None
    assert greedy(clock(spot_available=True)) == SPOT
    assert greedy(clock(running=ON_DEMAND, spot_available=True, remaining_work_s=5 * HOUR)) == ON_DEMAND


def test_uniform_progress_uses_on_demand_only_behind_the_line_and_leaves_it_two_restarts_ahead():
    behind = clock(now=20 * HOUR, remaining_work_s=95 * HOUR)   # line: 10 h done, we did 5
    ahead = clock(now=20 * HOUR, remaining_work_s=85 * HOUR)    # we did 15
    assert uniform_progress(behind) == ON_DEMAND
    assert uniform_progress(dataclasses.replace(behind, spot_available=True)) == SPOT
    assert uniform_progress(ahead) is None
    assert uniform_progress(dataclasses.replace(behind, running=ON_DEMAND, spot_available=True)) == ON_DEMAND
    assert uniform_progress(dataclasses.replace(ahead, running=ON_DEMAND, spot_available=True)) == SPOT


def test_ours_waits_for_spot_while_slack_covers_the_expected_overhead():
    behind = clock(now=20 * HOUR, remaining_work_s=95 * HOUR)   # slack ~ 80 h for 95 h of work
    assert deadline_aware(behind, spot_overhead_fraction=0.5) is None   # needs ~48 h: wait
    assert deadline_aware(behind, spot_overhead_fraction=1.2) == ON_DEMAND
    assert deadline_aware(dataclasses.replace(behind, spot_available=True), spot_overhead_fraction=1.2) == SPOT


def test_ours_goes_back_to_spot_when_slack_recovers_and_pauses_on_demand_only_well_ahead():
    on_od = clock(now=50 * HOUR, remaining_work_s=60 * HOUR, running=ON_DEMAND)  # slack ~ 87 h
    assert deadline_aware(dataclasses.replace(on_od, spot_available=True), spot_overhead_fraction=1.0) == SPOT
    assert deadline_aware(dataclasses.replace(on_od, spot_available=True), spot_overhead_fraction=2.0) == SPOT  # ahead of the line
    assert deadline_aware(on_od, spot_overhead_fraction=2.0) is None  # 15 h ahead > 10 % of the 100 h slack
    barely = dataclasses.replace(on_od, remaining_work_s=70 * HOUR)   # 5 h ahead: keep going
    assert deadline_aware(barely, spot_overhead_fraction=2.0) == ON_DEMAND


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), p_up=st.floats(0.0, 1.0), factor=st.sampled_from([1.2, 1.5, 2.0]))
def test_every_rule_meets_the_deadline_on_random_availability(simulator, seed, p_up, factor):
    """A tiny simulator run: Markov on/off spot capacity, preemptions without notice."""
    sim = simulator
    rng = random.Random(seed)
    available, up = [], rng.random() < p_up
    for _ in range(1500):
        if rng.random() < 0.1:
            up = rng.random() < p_up
        available.append(up)
    work = 300 * 300.0
    for policy in ("greedy", "uniform_progress", "ours"):
        run = sim.simulate(available, 300.0, 0, work, factor * work, policy)
        assert run.finished_at <= factor * work, policy
