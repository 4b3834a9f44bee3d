"""The learning policies as the control plane runs them: interval per instance sent
in heartbeat answers, placement away from the zone that just preempted, deadline-
aware market choice, interruption rates in the API."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from respawn import protocol
from respawn_server.jobs.core.choices import EndReason, InstanceState, JobStatus
from respawn_server.jobs.core.transitions import end_instance
from respawn_server.jobs.fleet.placement import choose
from respawn_server.jobs.fleet.scheduler import schedule
from respawn_server.jobs.models import Instance
from tests.agent_api.helpers import AgentClient
from tests.factories import make_instance, make_job, make_team_with_members


@pytest.fixture
def setup(settings, db):
    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": ["local"]}
    return make_team_with_members()


def local_job(setup, **fields):
    return make_job(setup.team, setup.people["member"].user, allowed_clouds=["local"], **fields)


def registered(job, **fields):
    agent = AgentClient()
    setup = make_instance(job, **fields)
    assert agent.register(setup.bootstrap_token).status_code == 200
    return agent, Instance.objects.get(pk=setup.instance.pk)


def test_heartbeat_answers_carry_young_daly_bounded_by_default(setup):
    job = local_job(setup, status=JobStatus.PROVISIONING)
    agent, instance = registered(job, zone="local-a", market="spot")
    answer = agent.post("heartbeat", protocol.Heartbeat(step=1)).json()
    # A fresh zone is assumed to interrupt as its prior bucket says; with a cheap
    # checkpoint Young/Daly exceeds 20 minutes, so the upper bound wins.
    assert answer["checkpoint_interval_s"] == 1200.0
    assert instance.checkpoint_interval["source"] == "maximum"
    assert instance.checkpoint_interval["unnoticed_mtbi_s"] > 0


def test_a_jobs_own_interval_wins(setup):
    job = local_job(setup, status=JobStatus.PROVISIONING, checkpoint_interval_s=45)
    agent, instance = registered(job)
    assert agent.post("heartbeat", protocol.Heartbeat(step=1)).json()["checkpoint_interval_s"] == 45
    assert instance.checkpoint_interval["source"] == "override"


def test_a_relaunch_avoids_the_zone_that_just_preempted_when_another_is_close(setup):
    job = local_job(setup, status=JobStatus.RUNNING)
    first = make_instance(job, zone="local-a", state=InstanceState.RUNNING).instance
    Instance.objects.filter(pk=first.pk).update(running_at=timezone.now() - timedelta(hours=1))
    first.refresh_from_db()
    end_instance(first, EndReason.PREEMPTED)
    choice = choose(job)
    assert choice.chosen.placement.zone != "local-a"
    assert "outside the zone that just preempted" in choice.reason


def test_a_near_deadline_goes_on_demand_and_a_far_one_stays_on_spot(setup):
    far = local_job(setup, total_steps=100, deadline=timezone.now() + timedelta(days=30))
    near = local_job(setup, total_steps=100, deadline=timezone.now() + timedelta(minutes=66))
    assert choose(far).chosen.placement.market == "spot"
    # An hour of work (nothing measured yet) and 66 minutes left: on-demand now is the only
    # chance, so the safety net fires; spot waits for jobs whose slack covers a preemption.
    assert choose(near).chosen.placement.market == "on_demand"


def test_repeated_capacity_errors_put_a_zone_on_back_off(setup):
    job = local_job(setup)
    for _ in range(2):
        failed = make_instance(job, zone="local-a").instance
        end_instance(failed, EndReason.CAPACITY_ERROR)
    schedule()
    assert Instance.objects.get(job=job, state=InstanceState.REQUESTED).zone != "local-a"


def test_interruption_rates_are_in_the_api(setup):
    job = local_job(setup)
    done = make_instance(job, zone="local-b", state=InstanceState.RUNNING).instance
    Instance.objects.filter(pk=done.pk).update(running_at=timezone.now() - timedelta(hours=2))
    done.refresh_from_db()
    end_instance(done, EndReason.PREEMPTED)
    Instance.objects.filter(pk=done.pk).update(preemption_confirmed=True)  # the cloud said so
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {setup.people['viewer'].token}")
    rows = client.get("/api/v1/interruption-rates/").json()
    b = next(r for r in rows if r["provider"] == "local" and r["zone"] == "local-b")
    a = next(r for r in rows if r["provider"] == "local" and r["zone"] == "local-a")
    assert b["events"] == 1 and b["exposure_hours"] == pytest.approx(2, rel=0.01)
    assert b["mean_per_hour"] > a["mean_per_hour"] == pytest.approx(a["prior_per_hour"], rel=1e-12)
    assert b["per_hour"] > a["per_hour"]
    for row in (a, b):  # the point estimate shown lies inside its interval
        assert row["per_hour_low"] <= row["per_hour"] <= row["per_hour_high"]
