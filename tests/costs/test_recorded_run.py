"""Money and ETA of a real local-provider run, recorded by record_local_run.py.

The run: one tiny training job, every VM reclaimed 20 s after it booted, five
identical instances (four preempted, one completed). Each resumed instance's agent
heartbeated at step 0 for several seconds before its trainer had loaded the
checkpoint, as real agents do."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from statistics import median

import pytest
from django.test import Client

from respawn_server.jobs.money import costs
from tests.costs import recorded
from tests.factories import make_team_with_members

RUN = recorded.read()
ON_DEMAND = Decimal("1.00")  # the price book's local on-demand price, $/h


def training_seconds_per_step(run: dict) -> float:
    """The trainer's speed, from consecutive heartbeats both past their instance's resume step."""
    resume = {c["id"]: c["step"] for c in run["checkpoints"]}
    since = {i["id"]: resume.get(i["resume_checkpoint_id"], 0) for i in run["instances"]}
    ratios, last = [], {}
    for p in run["metric_points"]:
        prev = last.get(p["instance_id"])
        if prev and prev["step"] > since[p["instance_id"]] and p["step"] > prev["step"]:
            ratios.append((recorded.at(p["time"]) - recorded.at(prev["time"])).total_seconds()
                          / (p["step"] - prev["step"]))
        last[p["instance_id"]] = p
    return median(ratios)


@pytest.fixture
def setup(db):
    return make_team_with_members()


def test_the_recording_is_a_run_resumed_after_preemptions_with_pre_load_heartbeats():
    ends = [i["end_reason"] for i in RUN["instances"]]
    assert ends.count("preempted") >= 3 and ends[-1] == "completed"
    resumed = [i["id"] for i in RUN["instances"] if i["resume_checkpoint_id"]]
    first_steps = {i: next(p["step"] for p in RUN["metric_points"] if p["instance_id"] == i) for i in resumed}
    assert set(first_steps.values()) == {0}  # the agent heartbeats before its trainer reports


def test_each_instance_is_credited_with_the_work_it_kept(setup):
    job, instances = recorded.load(setup.team, setup.people["member"].user, RUN)
    cost = costs.job_cost(job)
    speed = Decimal(str(training_seconds_per_step(RUN)))
    per_step = []
    for row in cost.ledger.instances:
        work = cost.work[int(row.instance_id)]
        assert work.steps_kept > 100, work
        # What the kept steps would have cost on on-demand at the trainer's measured speed.
        expected = work.steps_kept * speed * ON_DEMAND / 3600
        assert row.baseline == pytest.approx(expected, rel=Decimal("0.25")), (work, row.baseline, expected)
        per_step.append(row.baseline / work.steps_kept)
    # Identical instances: the same baseline per kept step, not one falling with each relaunch.
    assert max(per_step) / min(per_step) < Decimal("1.3"), per_step


def test_identical_spot_instances_cheaper_than_on_demand_never_show_negative_savings(setup):
    job, _ = recorded.load(setup.team, setup.people["member"].user, RUN)
    cost = costs.job_cost(job)
    for row in cost.ledger.instances:
        assert row.savings > 0, (row.instance_id, row.spent, row.baseline)
    assert cost.ledger.savings > 0


@pytest.mark.parametrize("seconds_into_run", [10, 20])
def test_the_eta_is_the_remaining_steps_at_the_trainers_speed(setup, seconds_into_run):
    # A moment `seconds_into_run` after the newest instance registered (its heartbeats past
    # the pre-load ones), mid-run, as the dashboard shows it then.
    newest = [i for i in RUN["instances"] if i["resume_checkpoint_id"]][-2]
    moment = recorded.at(newest["registered_at"]) + dt.timedelta(seconds=seconds_into_run)
    job, _ = recorded.load(setup.team, setup.people["member"].user, RUN, until=moment)
    browser = Client()
    browser.force_login(setup.people["member"].user)
    [row] = browser.get("/jobs.json").json()["rows"]
    remaining = RUN["job"]["total_steps"] - row["last_step"]
    expected = remaining * training_seconds_per_step(RUN)
    assert row["eta_s"] == pytest.approx(expected, rel=0.25), (row["eta_display"], remaining, expected)
