"""Malformed requests to every endpoint: a 4xx naming the field, never a 500,
and no row changed."""

import uuid
from datetime import timedelta

import pytest
from django.apps import apps
from django.utils import timezone
from rest_framework.test import APIClient

from respawn import protocol
from respawn_server.jobs.core.choices import JobStatus
from tests.agent_api.helpers import AgentClient, checkpoint_report
from tests.factories import make_instance, make_job, make_team_with_members

EVENT = "4d5e6f70-0000-4000-8000-000000000000"


def row_counts():
    return {m.__name__: m.objects.count() for m in apps.get_app_config("jobs").get_models()}


@pytest.fixture
def agent(db):
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.PROVISIONING)
    client = AgentClient()
    client.register(make_instance(job).bootstrap_token)
    client.checkpoint = checkpoint_report(job, 1)
    client.post("checkpoints", client.checkpoint)
    client.setup = setup
    return client


AGENT_CASES = [
    # (path, body, field expected in the error)
    ("heartbeat", {"event_id": EVENT, "step": -1}, "step"),
    ("heartbeat", {"event_id": EVENT, "step": "ten"}, "step"),
    ("heartbeat", {"event_id": "not-a-uuid", "step": 1}, "event_id"),
    ("heartbeat", {"step": 1}, "event_id"),
    ("heartbeat", {"event_id": EVENT, "step": 1, "loss": "NaN"}, "loss"),
    ("notice", {"event_id": EVENT, "source": "carrier_pigeon", "notice_time": "2026-01-01T00:00:00Z"}, "source"),
    ("notice", {"event_id": EVENT, "source": "aws_imds", "notice_time": "yesterday"}, "notice_time"),
    ("checkpoints", {"event_id": EVENT, "checkpoint_id": "x", "step": 1, "uri": "/a", "bytes": 1,
                     "manifest_digest": "d"}, "checkpoint_id"),
    ("checkpoints", {"event_id": EVENT, "checkpoint_id": str(uuid.uuid4()), "step": 1, "uri": "/a", "bytes": -5,
                     "manifest_digest": "d"}, "bytes"),
    ("checkpoints", {"event_id": EVENT, "checkpoint_id": str(uuid.uuid4()), "step": 1, "uri": "/a", "bytes": 1,
                     "manifest_digest": "d", "kind": "whenever"}, "kind"),
    ("checkpoints", {"event_id": EVENT, "checkpoint_id": str(uuid.uuid4()), "step": 1, "uri": "/a", "bytes": 1,
                     "manifest_digest": "d", "tiers": ["memory"]}, "tiers"),  # committed, so in storage
    ("checkpoints", {"event_id": EVENT, "checkpoint_id": str(uuid.uuid4()), "step": 1, "uri": "/a", "bytes": 1,
                     "manifest_digest": "d", "tiers": ["storage", "tape"]}, "tiers"),
    ("checkpoints", {"event_id": EVENT, "checkpoint_id": str(uuid.uuid4()), "step": 1, "uri": "/a", "bytes": 1,
                     "manifest_digest": "d", "tiers": "storage"}, "tiers"),
    ("logs", {"event_id": EVENT, "offset": 0, "lines": "not a list"}, "lines"),
    ("logs", {"event_id": EVENT, "offset": 0, "lines": ["x"] * (protocol.MAX_LOG_LINES_PER_BATCH + 1)}, "lines"),
    ("logs", {"event_id": EVENT, "offset": -3, "lines": []}, "offset"),
    ("exit", {"event_id": EVENT, "reason": "bored"}, "reason"),
    ("exit", {"event_id": EVENT, "reason": "failed", "exit_code": "one"}, "exit_code"),
]


@pytest.mark.parametrize("path,body,field", AGENT_CASES, ids=[f"{c[0]}-{c[2]}-{i}" for i, c in enumerate(AGENT_CASES)])
def test_malformed_agent_report_is_400_naming_the_field(agent, path, body, field):
    before = row_counts()
    response = agent.post(path, body)
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"]
    assert row_counts() == before


def test_malformed_validation_is_400(agent):
    before = row_counts()
    response = agent.post(f"checkpoints/{agent.checkpoint.checkpoint_id}/validation",
                          {"event_id": EVENT, "result": "pending"})
    assert response.status_code == 400 and "result" in response.json()["errors"]
    assert row_counts() == before


@pytest.mark.parametrize("path", ["heartbeat", "notice", "checkpoints", "logs", "exit", "register"])
def test_malformed_json_and_non_objects_are_400(agent, path):
    before = row_counts()
    raw = agent.client.post(protocol.API_PREFIX + path, "{not json", content_type="application/json")
    assert raw.status_code == 400
    listed = agent.client.post(protocol.API_PREFIX + path, "[1, 2]", content_type="application/json")
    assert listed.status_code == 400
    assert row_counts() == before


@pytest.mark.parametrize("path", ["heartbeat", "notice", "checkpoints", "logs", "exit"])
def test_oversized_agent_body_is_413(agent, path):
    before = row_counts()
    body = {"event_id": EVENT, "offset": 0, "lines": ["x" * 4000] * 100}
    assert agent.post(path, body).status_code == 413
    assert row_counts() == before


@pytest.mark.parametrize("path", ["heartbeat", "notice", "checkpoints", "logs", "exit"])
@pytest.mark.parametrize("token", [None, "rsa_wrong", "garbage with spaces"])
def test_wrong_or_missing_agent_token_is_401(agent, path, token):
    before = row_counts()
    client = APIClient()
    if token:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    response = client.post(protocol.API_PREFIX + path, {"event_id": EVENT, "step": 1}, format="json")
    assert response.status_code == 401
    assert row_counts() == before


def test_register_with_unknown_or_reused_token_changes_nothing(agent):
    before = row_counts()
    assert AgentClient().register("rsb_unknown").status_code == 401
    assert AgentClient().post("register", {"event_id": EVENT}).status_code == 400
    assert row_counts() == before


@pytest.fixture
def person(db):
    setup = make_team_with_members()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {setup.people['member'].token}")
    client.team = setup.team
    return client


JOB_CASES = [
    ({"command": []}, "command"),
    ({"command": "python train.py"}, "command"),
    ({"command": ["python", 3]}, "command"),
    ({"nodes": 0}, "nodes"),
    ({"nodes": "two"}, "nodes"),
    ({"total_steps": -10}, "total_steps"),
    ({"deadline": (timezone.now() - timedelta(hours=1)).isoformat()}, "deadline"),
    ({"allowed_clouds": ["aws", "oracle"]}, "allowed_clouds"),
    ({"checkpoint_uri": "ftp://host/x"}, "checkpoint_uri"),
    ({"validation_model_factory": "not a factory"}, "validation_model_factory"),
    ({"env": {"A": 1}}, "env"),
    ({"priority": 1000}, "priority"),
    ({"max_price_per_hour": -1}, "max_price_per_hour"),
    ({"team": 999999}, "team"),
    ({"name": ""}, "name"),
]


@pytest.mark.parametrize("change,field", JOB_CASES, ids=[c[1] + str(i) for i, c in enumerate(JOB_CASES)])
def test_malformed_job_is_400_naming_the_field(person, change, field):
    before = row_counts()
    body = {"team": person.team.pk, "name": "resnet", "command": ["python", "train.py"], **change}
    response = person.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"]
    assert row_counts() == before


def test_malformed_json_to_people_api_is_400(person):
    before = row_counts()
    response = person.post("/api/v1/jobs/", "{nope", content_type="application/json")
    assert response.status_code == 400
    assert row_counts() == before


def test_unknown_filter_values_are_400_not_500(person):
    assert person.get("/api/v1/jobs/?status=sleeping").status_code == 400
    assert person.get("/api/v1/instances/?job=abc").status_code == 400


def test_login_with_wrong_password_is_401_and_makes_no_token(person):
    before = row_counts()
    response = APIClient().post("/api/v1/auth/token/", {"username": "vision-member", "password": "nope"}, format="json")
    assert response.status_code == 401
    # Only the attempt is kept, for the login rate limit.
    assert {**row_counts(), "RateLimitBucket": 0} == {**before, "RateLimitBucket": 0}
