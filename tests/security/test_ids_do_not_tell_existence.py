"""Another team's job or team id answers exactly as an id that exists nowhere:
same status, same body (the id itself aside), on every list filter, detail
endpoint and submit of the people's API, and on the dashboard's pages."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from respawn_server.jobs.core.choices import Role
from respawn_server.jobs.models import Checkpoint, InterruptionEvent
from tests.api.clients import client_for
from tests.factories import make_instance, make_job, make_team_with_members

NOWHERE = 987654


@pytest.fixture
def theirs(db):
    """The vision team's objects, and their outsider (admin of another team only)."""
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people[Role.MEMBER].user)
    instance = make_instance(job, registered=True).instance
    Checkpoint.objects.create(checkpoint_id="00000000-0000-4000-8000-000000000001", job=job, instance=instance,
                              step=10, uri="/x", bytes=1, manifest_digest="d", committed_at="2026-01-01T00:00:00Z")
    InterruptionEvent.objects.create(instance=instance, kind="notice", source="aws_imds")
    return setup, {"job": job.pk, "team": setup.team.pk, "instance": instance.pk}


def same_answer(ask, existing: int) -> None:
    """`ask(id)` gives the same answer for another team's id as for one nobody has (numbers aside)."""
    there, nowhere = ask(existing), ask(NOWHERE)
    assert there.status_code == nowhere.status_code, (there.content, nowhere.content)
    assert re.sub(r"\d+", "N", there.content.decode()) == re.sub(r"\d+", "N", nowhere.content.decode())


API_FILTERS = [
    ("/api/v1/jobs/?team={}", "team"),
    ("/api/v1/instances/?job={}", "job"),
    ("/api/v1/checkpoints/?job={}", "job"),
    ("/api/v1/interruptions/?instance__job={}", "job"),
    ("/api/v1/audit/?team={}", "team"),
]


@pytest.mark.parametrize("url,kind", API_FILTERS)
def test_list_filters_answer_another_teams_id_as_an_unknown_one(theirs, url, kind):
    setup, ids = theirs
    outsider = client_for(setup.people["outsider"])
    same_answer(lambda pk: outsider.get(url.format(pk)), ids[kind])
    assert outsider.get(url.format(ids[kind])).json()["results"] == []


API_DETAILS = ["/api/v1/jobs/{}/", "/api/v1/jobs/{}/events/", "/api/v1/jobs/{}/logs/", "/api/v1/jobs/{}/cost/",
               "/api/v1/instances/{}/", "/api/v1/teams/{}/", "/api/v1/teams/{}/cost/", "/api/v1/teams/{}/limits/",
               "/api/v1/teams/{}/members/"]


@pytest.mark.parametrize("url", API_DETAILS)
def test_detail_endpoints_answer_another_teams_id_as_an_unknown_one(theirs, url):
    setup, ids = theirs
    outsider = client_for(setup.people["outsider"])
    kind = "instance" if "instances" in url else "job" if "jobs" in url else "team"
    same_answer(lambda pk: outsider.get(url.format(pk)), ids[kind])


def test_submitting_into_another_team_answers_as_into_an_unknown_one(theirs):
    setup, ids = theirs
    outsider = client_for(setup.people["outsider"])
    for team in (ids["team"], str(ids["team"])):  # the CLI sends names and ids as strings
        same_answer(lambda pk: outsider.post("/api/v1/jobs/", {"team": pk if isinstance(team, int) else str(pk),
                                                               "name": "x", "command": ["a"]}, format="json"),
                    ids["team"])
    refused = outsider.post("/api/v1/jobs/", {"team": ids["team"], "name": "x", "command": ["a"]}, format="json")
    assert refused.status_code == 400 and "team" in refused.json()["errors"]


DASHBOARD = [("get", "/jobs/{}/", "job"), ("get", "/jobs/{}/status.json", "job"), ("post", "/jobs/{}/cancel/", "job"),
             ("get", "/teams/{}/", "team"), ("get", "/teams/{}/status.json", "team"),
             ("post", "/teams/{}/submit/", "team"), ("get", "/teams/{}/settings/", "team"),
             ("post", "/team/switch/", "team")]


@pytest.mark.parametrize("method,url,kind", DASHBOARD)
def test_dashboard_pages_answer_another_teams_id_as_an_unknown_one(theirs, method, url, kind):
    setup, ids = theirs
    page = Client()
    page.force_login(setup.people["outsider"].user)
    same_answer(lambda pk: getattr(page, method)(url.format(pk), {"team": pk, "name": "x", "command": "a"}),
                ids[kind])
