"""Monthly budgets: launches that would overrun wait with a visible reason and go
once the budget allows; running jobs are warned about, never killed."""

from decimal import Decimal

import pytest

from respawn_server.jobs.core.choices import InstanceState, JobStatus
from respawn_server.jobs.fleet.scheduler import schedule
from respawn_server.jobs.models import Instance, Job, JobEvent, Team
from respawn_server.jobs.money.budget import warn_over_budget
from tests.factories import make_instance, make_job, make_team_with_members


@pytest.fixture
def setup(settings, db):
    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": ["local"]}
    return make_team_with_members()


def test_a_launch_that_would_overrun_the_budget_waits_then_goes_when_raised(setup):
    Team.objects.filter(pk=setup.team.pk).update(monthly_budget_usd=Decimal("0.10"))
    job = make_job(setup.team, setup.people["member"].user, allowed_clouds=["local"])
    schedule()
    job.refresh_from_db()
    # An hour of expected work (nothing measured yet) at $0.30/h would pass $0.10.
    assert job.status == JobStatus.QUEUED and job.status_reason.startswith("waiting: monthly budget")
    assert not Instance.objects.filter(job=job).exists()
    Team.objects.filter(pk=setup.team.pk).update(monthly_budget_usd=Decimal("5"))
    schedule()
    assert Job.objects.get(pk=job.pk).status == JobStatus.PROVISIONING


def test_running_jobs_over_budget_are_warned_not_stopped(setup):
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING)
    running = make_instance(job, state=InstanceState.RUNNING, price_per_hour_at_launch=Decimal("3.00")).instance
    team = Team.objects.get(pk=setup.team.pk)
    team.monthly_budget_usd = Decimal("1.00")
    team.save()
    assert warn_over_budget(team) is True
    team.refresh_from_db()
    assert "exceeds the budget $1.00" in team.budget_warning
    assert JobEvent.objects.filter(job=job, message__startswith="budget warning").count() == 1
    assert warn_over_budget(team) is True  # no second event for the same warning
    assert JobEvent.objects.filter(job=job, message__startswith="budget warning").count() == 1
    assert Instance.objects.get(pk=running.pk).state == InstanceState.RUNNING
    team.monthly_budget_usd = Decimal("100")
    team.save()
    assert warn_over_budget(team) is False
    assert Team.objects.get(pk=team.pk).budget_warning == ""
