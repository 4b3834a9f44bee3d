"""The job page's drill: the button for members only, a post recording the drill (the
task queued, no cloud called), and the latest drill's report on the page."""

import pytest
from django.test import Client

from respawn_server.jobs.core import nudges
from respawn_server.jobs.core.choices import InstanceState, JobStatus
from respawn_server.jobs.models import Drill
from tests.factories import make_instance, make_job, make_team_with_members


@pytest.fixture
def setup(db, monkeypatch):
    monkeypatch.setattr(nudges, "send", lambda task, *args: None)
    return make_team_with_members()


def signed_in(person):
    client = Client()
    client.force_login(person.user)
    return client


def test_a_member_drills_from_the_job_page_and_sees_the_report(setup, django_capture_on_commit_callbacks):
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING)
    make_instance(job, state=InstanceState.RUNNING, provider_instance_id="local-1-abcdef01")
    member = signed_in(setup.people["member"])
    assert 'id="drill-form"' in member.get(f"/jobs/{job.pk}/").content.decode()

    with django_capture_on_commit_callbacks(execute=True):
        answer = member.post(f"/jobs/{job.pk}/drill/", {"node": "0", "without_notice": "1"})
    assert answer.status_code == 302
    drill = Drill.objects.get(job=job)
    assert drill.with_notice is False
    page = member.get(f"/jobs/{job.pk}/").content.decode()
    assert f"Drill {drill.pk} of node 0 (without notice" in page


def test_a_viewer_gets_no_button_and_cannot_post(setup):
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING)
    make_instance(job, state=InstanceState.RUNNING, provider_instance_id="local-1-abcdef01")
    viewer = signed_in(setup.people["viewer"])
    assert 'id="drill-form"' not in viewer.get(f"/jobs/{job.pk}/").content.decode()
    assert viewer.post(f"/jobs/{job.pk}/drill/", {"node": "0"}).status_code == 403
    assert not Drill.objects.exists()
