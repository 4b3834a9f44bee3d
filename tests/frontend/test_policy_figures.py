"""The job page shows the checkpoint interval with its inputs; the team overview
shows the interruption-rate estimates placement uses."""

from datetime import timedelta

from django.test import Client
from django.utils import timezone

from jobs.choices import EndReason, InstanceState, JobStatus
from jobs.models import Instance
from jobs.transitions import end_instance
from tests.agent_api.helpers import AgentClient
from tests.factories import make_instance, make_job, make_team_with_members


def test_job_page_shows_the_interval_and_team_page_the_rates(db):
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.PROVISIONING)
    AgentClient().register(make_instance(job, zone="local-a").bootstrap_token)
    old = make_instance(job, rank=1, zone="local-b", state=InstanceState.RUNNING).instance
    Instance.objects.filter(pk=old.pk).update(running_at=timezone.now() - timedelta(hours=3))
    old.refresh_from_db()
    end_instance(old, EndReason.PREEMPTED)
    browser = Client()
    browser.force_login(setup.people["viewer"].user)
    page = browser.get(f"/jobs/{job.pk}/").content.decode()
    assert "Every <strong>1200 s</strong> (maximum)" in page and "Young/Daly" in page
    team = browser.get(f"/teams/{setup.team.pk}/").content.decode()
    assert "Estimated interruption rates" in team and "local-b" in team
