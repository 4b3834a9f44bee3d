"""Hostile bodies and query parameters get a JSON 4xx naming the problem, never a
500 or Django's HTML error page: deeply nested JSON, bodies over the size limit,
months and log cursors outside what the server can count."""

from __future__ import annotations

import json
import uuid

import pytest
from django.conf import settings
from django.test import Client

from respawn_server.jobs.core.choices import InstanceState
from respawn_server.jobs.models import Job
from tests.api.clients import client_for
from tests.factories import make_instance, make_job

DEEP = "[" * 100_000 + "]" * 100_000


def anonymous() -> Client:
    return Client(raise_request_exception=False)


@pytest.fixture
def agent(team_setup):
    job = make_job(team_setup.team, team_setup.people["admin"].user)
    return make_instance(job, state=InstanceState.RUNNING, registered=True)


def agent_client(agent) -> Client:
    return Client(raise_request_exception=False, HTTP_AUTHORIZATION=f"Bearer {agent.agent_token}")


def refused_as_json(answer, status: int) -> dict:
    assert answer.status_code == status, answer.content[:300]
    assert answer["Content-Type"] == "application/json", answer["Content-Type"]
    return answer.json()


@pytest.mark.parametrize("path", ["/api/v1/auth/token/", "/api/agent/v1/register"])
def test_deeply_nested_json_to_an_unauthenticated_endpoint_is_a_400(db, path):
    body = refused_as_json(anonymous().post(path, DEEP, content_type="application/json"), 400)
    assert "nested deeper" in body["detail"]


@pytest.mark.parametrize("path", ["/api/agent/v1/heartbeat", "/api/agent/v1/checkpoints", "/api/agent/v1/notice"])
def test_deeply_nested_json_from_an_agent_is_a_400(agent, path):
    body = refused_as_json(agent_client(agent).post(path, DEEP, content_type="application/json"), 400)
    assert "nested deeper" in body["detail"]


def test_deeply_nested_json_to_the_peoples_api_is_a_400(team_setup):
    client = client_for(team_setup.people["admin"])
    client.raise_request_exception = False
    body = refused_as_json(client.post("/api/v1/jobs/", DEEP, content_type="application/json"), 400)
    assert "nested deeper" in body["detail"]


def test_a_command_nested_just_below_pythons_limit_is_refused_before_it_is_stored(team_setup):
    """Parsed fine by json, but every later walk of it (the JSONField, the database) recurses again."""
    client = client_for(team_setup.people["admin"])
    client.raise_request_exception = False
    command = "[" * 950 + "]" * 950
    body = f'{{"team": {team_setup.team.pk}, "name": "deep", "command": {command}}}'
    refused_as_json(client.post("/api/v1/jobs/", body, content_type="application/json"), 400)
    assert not Job.objects.filter(name="deep").exists()


def over_the_limit() -> str:
    return json.dumps({"name": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)})


@pytest.mark.parametrize("path", ["/api/v1/auth/token/", "/api/agent/v1/register"])
def test_a_body_over_the_size_limit_is_a_json_413_unauthenticated(db, path):
    body = refused_as_json(anonymous().post(path, over_the_limit(), content_type="application/json"), 413)
    assert str(settings.DATA_UPLOAD_MAX_MEMORY_SIZE) in body["detail"]


def test_a_body_over_the_size_limit_is_a_json_413_on_the_peoples_api(team_setup):
    client = client_for(team_setup.people["admin"])
    client.raise_request_exception = False
    refused_as_json(client.post("/api/v1/jobs/", over_the_limit(), content_type="application/json"), 413)
    form = "&".join(f"f{i}=1" for i in range(settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 1))
    body = refused_as_json(client.post("/api/v1/tokens/", form, content_type="application/x-www-form-urlencoded"), 400)
    assert "DATA_UPLOAD_MAX_NUMBER_FIELDS" in body["detail"]


def test_an_agent_body_over_the_size_limit_is_a_json_413(agent):
    body = json.dumps({"event_id": str(uuid.uuid4()), "lines": ["x" * 1000] * 2000, "offset": 0})
    refused_as_json(agent_client(agent).post("/api/agent/v1/logs", body, content_type="application/json"), 413)


@pytest.mark.parametrize("month", ["9999-12", "0000-01", "2026-13", "٢٠٢٦-١١", "2026-11\n"])
def test_a_month_outside_the_calendar_is_a_400_naming_month(team_setup, month):
    client = client_for(team_setup.people["admin"])
    client.raise_request_exception = False
    body = refused_as_json(client.get(f"/api/v1/teams/{team_setup.team.pk}/cost/", {"month": month}), 400)
    assert list(body["errors"]) == ["month"]


@pytest.mark.parametrize("month", ["9999-12", "0000-01"])
def test_the_dashboard_says_which_months_it_can_show(team_setup, month):
    browser = Client(raise_request_exception=False)
    browser.force_login(team_setup.people["admin"].user)
    page = browser.get(f"/teams/{team_setup.team.pk}/", {"month": month})
    assert page.status_code == 400
    assert "month must be between 1970-01 and 9998-12" in page.content.decode()
    status = browser.get(f"/teams/{team_setup.team.pk}/status.json", {"month": month})
    assert status.status_code == 400 and list(status.json()["errors"]) == ["month"]


def test_a_refused_submit_shows_the_form_again_whatever_month_the_address_names(team_setup):
    browser = Client(raise_request_exception=False)
    browser.force_login(team_setup.people["admin"].user)
    page = browser.post(f"/teams/{team_setup.team.pk}/submit/?month=9999-12", {"name": "x", "command": ""})
    assert page.status_code == 400
    assert "This field is required" in page.content.decode()


@pytest.mark.parametrize("after", ["9223372036854775808:0", "1:9223372036854775808", "1:²", "١:0"])
def test_a_log_cursor_beyond_what_was_given_out_is_a_400_naming_after(team_setup, after):
    job = make_job(team_setup.team, team_setup.people["admin"].user)
    client = client_for(team_setup.people["admin"])
    client.raise_request_exception = False
    body = refused_as_json(client.get(f"/api/v1/jobs/{job.pk}/logs/", {"after": after}), 400)
    assert list(body["errors"]) == ["after"]


def test_a_page_beyond_64_bits_is_answered_not_a_500(team_setup):
    for i in range(3):
        make_job(team_setup.team, team_setup.people["admin"].user, name=f"job-{i}")
    client = client_for(team_setup.people["admin"])
    client.raise_request_exception = False
    answer = client.get("/api/v1/jobs/?limit=9223372036854775808")
    assert answer.status_code == 200, answer.content[:300]
    assert len(answer.json()["results"]) == 3


def test_a_page_holds_at_most_a_thousand_rows(team_setup):
    for i in range(2):
        make_job(team_setup.team, team_setup.people["admin"].user, name=f"job-{i}")
    page = client_for(team_setup.people["admin"]).get("/api/v1/jobs/?limit=1000000&offset=1").json()
    assert "limit=1000&" in page["previous"] + "&"


def test_an_audit_moment_is_read_in_utc_whatever_its_offset(team_setup):
    client = client_for(team_setup.people["admin"])
    client.raise_request_exception = False
    # +17:42 is a moment Python reads and PostgreSQL refuses as an offset (a 500 there).
    assert client.get("/api/v1/audit/", {"since": "2026-01-26T18:11:39+17:42"}).status_code == 200
    for name, moment in (("until", "9999-12-31T23:59:59-14:00"), ("since", "0001-01-01T00:00:00+14:00")):
        body = refused_as_json(client.get("/api/v1/audit/", {name: moment}), 400)
        assert list(body["errors"]) == [name]


@pytest.mark.parametrize("path, query, says", [
    ("/", {"page": "9223372036854775808"}, "page"),
    ("/jobs.json", {"page": "9223372036854775808"}, "page"),
    ("/prices/", {"provider": "aws\x00"}, "provider: Null characters are not allowed."),
    ("/prices/", {"type": "g5\x00"}, "type: Null characters are not allowed."),
])
def test_the_dashboards_filters_refuse_what_the_database_cannot_take(team_setup, path, query, says):
    browser = Client(raise_request_exception=False)
    browser.force_login(team_setup.people["admin"].user)
    browser.get(f"/teams/{team_setup.team.pk}/")  # the dashboard's chosen team
    answer = browser.get(path, query)
    assert answer.status_code == 400, answer.content[:300]
    assert says in answer.content.decode()
