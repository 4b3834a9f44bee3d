"""POST /api/v1/jobs/{id}/drill/ and GET .../drills/: who may drill, what is refused, and
that the web request only records the drill and queues its task (no cloud call inline)."""

import pytest
from django.utils import timezone

from respawn_server.jobs.core import nudges
from respawn_server.jobs.core.choices import AuditAction, DrillStatus, InstanceState, JobStatus
from respawn_server.jobs.models import AuditEvent, Drill, Instance, JobEvent, MetricPoint
from tests.api.clients import client_for
from tests.factories import make_instance, make_job, make_team_with_members


@pytest.fixture
def setup(db):
    return make_team_with_members()


@pytest.fixture
def sent(monkeypatch):
    """The task messages the request queued (by name), instead of a broker."""
    messages = []
    monkeypatch.setattr(nudges, "send", lambda task, *args: messages.append((task, args)))
    return messages


def running_job(setup, nodes=1):
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING, nodes=nodes)
    for rank in range(nodes):
        make_instance(job, rank=rank, state=InstanceState.RUNNING, provider_instance_id=f"local-{rank}-abcdef01")
    return job


def drill(person, job, body=None):
    return client_for(person).post(f"/api/v1/jobs/{job.pk}/drill/", body or {}, format="json")


def test_it_lets_a_member_drill_and_records_audits_and_queues_the_task(setup, sent, django_capture_on_commit_callbacks):
    job = running_job(setup, nodes=2)
    with django_capture_on_commit_callbacks(execute=True):
        response = drill(setup.people["member"], job, {"node": 1, "without_notice": True})

    assert response.status_code == 202, response.content
    body = response.json()
    assert body["rank"] == 1 and body["with_notice"] is False and body["status"] == DrillStatus.REQUESTED
    made = Drill.objects.get(pk=body["id"])
    assert made.instance.rank == 1 and made.requested_by == setup.people["member"].user
    audit = AuditEvent.objects.get(action=AuditAction.JOB_DRILLED)
    assert audit.target == f"job:{job.pk}" and audit.details["drill"] == made.pk and audit.details["rank"] == 1
    assert sent == [(nudges.RUN_DRILL, (made.pk,))]
    assert JobEvent.objects.filter(job=job, message__startswith=f"drill {made.pk} requested").exists()


def test_it_refuses_a_viewer_and_hides_the_job_from_another_team(setup, sent):
    job = running_job(setup)
    assert drill(setup.people["viewer"], job).status_code == 403
    assert drill(setup.people["outsider"], job).status_code == 404
    assert client_for(setup.people["outsider"]).get(f"/api/v1/jobs/{job.pk}/drills/").status_code == 404
    assert not Drill.objects.exists() and not sent


def test_it_names_the_bad_field(setup, sent):
    job = running_job(setup, nodes=2)
    for body, field in (({"node": 2}, "node"), ({"node": -1}, "node"), ({"node": "x"}, "node"),
                        ({"without_notice": "maybe"}, "without_notice")):
        response = drill(setup.people["member"], job, body)
        assert response.status_code == 400, body
        assert field in response.json()["errors"], response.json()


def test_it_answers_409_when_nothing_runs_or_a_drill_is_in_flight(setup, sent):
    queued = make_job(setup.team, setup.people["member"].user)
    assert drill(setup.people["member"], queued).status_code == 409
    job = running_job(setup)
    assert drill(setup.people["admin"], job).status_code == 202
    again = drill(setup.people["admin"], job)
    assert again.status_code == 409 and "one at a time" in again.json()["detail"]


def test_a_sent_drill_holds_the_next_until_its_report_has_a_verdict(setup, sent):
    job = running_job(setup)
    first = Drill.objects.get(pk=drill(setup.people["member"], job).json()["id"])
    Drill.objects.filter(pk=first.pk).update(status=DrillStatus.SENT, interrupted_at=timezone.now())
    Instance.objects.filter(pk=first.instance_id).update(state=InstanceState.ENDED, ended_at=timezone.now())
    replacement = make_instance(job, state=InstanceState.RUNNING, provider_instance_id="local-9-abcdef02",
                                registered_at=timezone.now()).instance
    assert drill(setup.people["member"], job).status_code == 409  # recovering: no verdict yet
    MetricPoint.objects.create(job=job, instance=replacement, time=timezone.now(), step=1)  # training again
    assert drill(setup.people["member"], job).status_code == 202


def test_a_viewer_reads_the_drills_of_the_job(setup, sent):
    job = running_job(setup)
    drill(setup.people["member"], job)
    listed = client_for(setup.people["viewer"]).get(f"/api/v1/jobs/{job.pk}/drills/")
    assert listed.status_code == 200
    [only] = listed.json()
    assert only["requested_by"] == setup.people["member"].user.username and only["passed"] is None
