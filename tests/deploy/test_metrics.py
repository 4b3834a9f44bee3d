"""/metrics as Prometheus scrapes it: parsed with prometheus_client's own parser."""

import uuid
from datetime import timedelta

import pytest
from celery import current_app
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from respawn_server.jobs.core.choices import InstanceState, InterruptionKind, JobStatus
from respawn_server.jobs.models import Checkpoint, InterruptionEvent
from tests.factories import make_instance, make_job, make_team_with_members

pytestmark = pytest.mark.django_db


@current_app.task(name="tests.deploy.explode")
def explode():
    raise RuntimeError("boom")


def scrape(client, **headers) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.content.decode()) for s in family.samples}


@pytest.fixture
def fleet():
    setup = make_team_with_members()
    owner = setup.people["admin"].user
    running = make_job(setup.team, owner, status=JobStatus.RUNNING)
    make_job(setup.team, owner, status=JobStatus.RUNNING)
    make_job(setup.team, owner, status=JobStatus.QUEUED)
    now = timezone.now()
    fresh = make_instance(running, state=InstanceState.RUNNING, last_heartbeat_at=now - timedelta(seconds=3)).instance
    make_instance(running, rank=1, state=InstanceState.RUNNING, last_heartbeat_at=now - timedelta(seconds=90))
    # An ended instance's silence is not lag.
    make_instance(running, rank=2, state=InstanceState.ENDED, last_heartbeat_at=now - timedelta(days=3))
    for save_s, stall_s in ((0.3, 0.05), (4.0, 0.2), (45.0, None)):
        Checkpoint.objects.create(checkpoint_id=uuid.uuid4(), job=running, instance=fresh, step=10, uri="/tmp/c", bytes=1,
                                  manifest_digest="x", committed_at=now, save_s=save_s, stall_s=stall_s)
    for kind, source in ((InterruptionKind.NOTICE, "aws_imds"), (InterruptionKind.NOTICE, "aws_imds"),
                         (InterruptionKind.LOST, "heartbeat_timeout")):
        InterruptionEvent.objects.create(instance=fresh, kind=kind, source=source)


def test_jobs_interruptions_checkpoints_and_heartbeat_lag(client, fleet):
    m = scrape(client)
    assert m[("respawn_jobs", (("state", "running"),))] == 2
    assert m[("respawn_jobs", (("state", "queued"),))] == 1
    assert m[("respawn_jobs", (("state", "failed"),))] == 0
    assert m[("respawn_interruptions_total", (("kind", "notice"), ("source", "aws_imds")))] == 2
    assert m[("respawn_interruptions_total", (("kind", "lost"), ("source", "heartbeat_timeout")))] == 1

    assert m[("respawn_checkpoint_save_seconds_count", ())] == 3
    assert m[("respawn_checkpoint_save_seconds_bucket", (("le", "0.5"),))] == 1
    assert m[("respawn_checkpoint_save_seconds_bucket", (("le", "5.0"),))] == 2
    assert m[("respawn_checkpoint_save_seconds_bucket", (("le", "+Inf"),))] == 3
    assert m[("respawn_checkpoint_save_seconds_sum", ())] == pytest.approx(49.3)
    assert m[("respawn_checkpoint_stall_seconds_count", ())] == 2  # a save without a stall figure is not a zero stall

    assert 90 <= m[("respawn_heartbeat_lag_max_seconds", ())] < 3600
    assert m[("respawn_heartbeat_lag_seconds_count", ())] == 2
    assert m[("respawn_heartbeat_lag_seconds_bucket", (("le", "5.0"),))] == 1
    assert m[("respawn_heartbeat_lag_seconds_bucket", (("le", "120.0"),))] == 2


def test_an_empty_deployment_scrapes_cleanly(client):
    m = scrape(client)
    assert m[("respawn_heartbeat_lag_max_seconds", ())] == 0
    assert m[("respawn_checkpoint_save_seconds_count", ())] == 0
    assert sum(v for (name, _), v in m.items() if name == "respawn_jobs") == 0


def test_a_failed_celery_task_is_counted(client):
    before = scrape(client).get(("respawn_celery_task_failures_total", (("task", "tests.deploy.explode"),)), 0)
    result = explode.apply()
    assert result.failed()
    after = scrape(client)
    assert after[("respawn_celery_task_failures_total", (("task", "tests.deploy.explode"),))] == before + 1
    assert ("respawn_celery_task_failures_total", (("task", "respawn_server.jobs.tasks.reconcile"),)) in after


def test_metrics_token_guards_the_endpoint_when_set(client, settings):
    settings.RESPAWN_METRICS_TOKEN = "s3cret-scrape"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert "respawn_jobs" in str(scrape(client, HTTP_AUTHORIZATION="Bearer s3cret-scrape"))


def test_metrics_need_no_login(client):
    response = client.get("/metrics")
    assert response.status_code == 200 and b"respawn_jobs" in response.content
