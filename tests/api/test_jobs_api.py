"""The people's job API: submit, list with filters and pages, retrieve, cancel."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from respawn_server.jobs.core.choices import InstanceState, JobStatus
from respawn_server.jobs.models import ApiToken, Job, JobEvent
from tests.api.clients import client_for
from tests.factories import make_instance, make_job, make_team_with_members


@pytest.fixture
def setup(db):
    return make_team_with_members()


def test_member_submits_a_job_and_it_waits_in_the_queue(setup, settings):
    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": ["aws", "gcp"]}
    member = setup.people["member"]
    response = client_for(member).post("/api/v1/jobs/", {
        "team": setup.team.pk, "name": "llama-ft", "command": ["torchrun", "train.py"], "nodes": 2,
        "total_steps": 5000, "instance_types": ["g5.12xlarge"], "allowed_clouds": ["aws", "gcp"],
    }, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "queued" and body["owner"] == member.user.username and body["nodes"] == 2
    assert body["checkpoint_uri"]  # a default storage location is filled in
    assert JobEvent.objects.filter(job_id=body["id"]).exists()


def test_list_filters_by_status_owner_and_search_and_pages(setup):
    member, admin = setup.people["member"].user, setup.people["admin"].user
    for i in range(7):
        make_job(setup.team, member, name=f"resnet-{i}")
    make_job(setup.team, admin, name="bert", status=JobStatus.RUNNING)
    client = client_for(setup.people["viewer"])
    assert client.get("/api/v1/jobs/?status=running").json()["count"] == 1
    assert client.get(f"/api/v1/jobs/?owner={admin.username}").json()["count"] == 1
    assert client.get("/api/v1/jobs/?search=resnet").json()["count"] == 7
    page = client.get("/api/v1/jobs/?limit=3&offset=3").json()
    assert page["count"] == 8 and len(page["results"]) == 3 and page["next"] and page["previous"]


def test_job_list_query_count_does_not_grow_with_jobs(setup):
    client = client_for(setup.people["viewer"])

    def count():
        with CaptureQueriesContext(connection) as queries:
            assert client.get("/api/v1/jobs/").status_code == 200
        return len(queries)

    make_job(setup.team, setup.people["member"].user)
    count()  # the first call also stamps the token's last use
    few = count()
    for _ in range(10):
        make_job(setup.team, setup.people["member"].user)
    assert count() == few


def test_cancel_a_queued_job_ends_it_at_once(setup):
    job = make_job(setup.team, setup.people["member"].user)
    response = client_for(setup.people["member"]).post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert response.status_code == 202 and response.json()["status"] == "cancelled"
    again = client_for(setup.people["member"]).post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert again.status_code == 409


def test_cancel_a_running_job_waits_for_its_instances(setup):
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING)
    make_instance(job, state=InstanceState.RUNNING, registered=True)
    response = client_for(setup.people["admin"]).post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert response.json()["status"] == "cancelling"
    assert Job.objects.get(pk=job.pk).status == JobStatus.CANCELLING


def test_login_gives_a_token_shown_once_and_stored_hashed(setup):
    response = APIClient().post("/api/v1/auth/token/", {"username": "vision-member",
                                                        "password": "correct horse battery"}, format="json")
    assert response.status_code == 201
    token = response.json()["token"]
    assert not ApiToken.objects.filter(key_hash=token).exists()
    assert APIClient(HTTP_AUTHORIZATION=f"Bearer {token}").get("/api/v1/jobs/").status_code == 200


def test_openapi_schema_describes_both_apis(client):
    response = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    assert "/api/v1/jobs/" in paths and "/api/agent/v1/heartbeat" in paths
    assert response.json()["openapi"].startswith("3.")


def test_an_unknown_field_is_refused_naming_it_and_the_field_meant(setup):
    response = client_for(setup.people["member"]).post("/api/v1/jobs/", {
        "team": setup.team.pk, "name": "x", "command": ["python", "train.py"], "totl_steps": 5000,
        "status": "running",
    }, format="json")
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert errors["totl_steps"] == ["unknown field 'totl_steps'; did you mean 'total_steps'?"]
    assert errors["status"] == ["'status' is set by the server; it cannot be submitted"]
    assert Job.objects.count() == 0


def test_a_team_is_taken_by_name_or_by_id(setup):
    client = client_for(setup.people["member"])
    body = {"name": "x", "command": ["python", "train.py"]}
    by_name = client.post("/api/v1/jobs/", {**body, "team": setup.team.name}, format="json")
    by_id = client.post("/api/v1/jobs/", {**body, "team": setup.team.pk}, format="json")
    assert (by_name.status_code, by_id.status_code) == (201, 201), (by_name.content, by_id.content)
    assert by_name.json()["team"] == by_id.json()["team"] == setup.team.pk
    # Another team's name reads as no team at all: names of other teams are not disclosed.
    other = client.post("/api/v1/jobs/", {**body, "team": setup.other_team.name}, format="json")
    assert other.status_code == 400
    assert other.json()["errors"]["team"] == [f"you are in no team '{setup.other_team.name}'; your teams: {setup.team.name}"]
    assert Job.objects.count() == 2


def test_the_schema_says_which_fields_a_job_takes_and_how_its_team_is_named(client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()["components"]["schemas"]
    assert schema["JobRequest"]["additionalProperties"] is False
    assert schema["JobRequest"]["properties"]["team"]["oneOf"] == [{"type": "integer"}, {"type": "string"}]
    assert schema["Job"]["properties"]["team"]["type"] == "integer"


def test_validation_is_enabled_only_for_a_job_that_names_what_to_validate_with(setup, settings):
    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": ["local"]}
    client = client_for(setup.people["member"])
    spec = {"team": setup.team.pk, "name": "plain", "command": ["python", "train.py"], "allowed_clouds": ["local"]}
    without = client.post("/api/v1/jobs/", spec, format="json")
    assert without.status_code == 201, without.content
    assert without.json()["validation_enabled"] is False
    factories = {"validation_model_factory": "m:model", "validation_batch_factory": "m:batch"}
    with_them = client.post("/api/v1/jobs/", {**spec, **factories}, format="json")
    assert with_them.json()["validation_enabled"] is True
