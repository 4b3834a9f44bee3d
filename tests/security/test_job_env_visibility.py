"""A job's env values (API keys, often) reach only the people who may run the
team's jobs and the job's owner; a viewer reads the names and no value, in the
API's detail and list and on the dashboard."""

from __future__ import annotations

import pytest
from django.test import Client

from respawn_server.jobs.core.choices import Role
from respawn_server.jobs.models import Membership
from tests.api.clients import client_for
from tests.factories import make_job

ENV = {"WANDB_API_KEY": "wandb-secret-value", "BATCH": "64"}


@pytest.fixture
def job_with_env(team_setup):
    return make_job(team_setup.team, team_setup.people[Role.MEMBER].user, env=ENV)


def api_env(person, job) -> tuple[dict, dict]:
    client = client_for(person)
    detail = client.get(f"/api/v1/jobs/{job.pk}/")
    listed = client.get("/api/v1/jobs/")
    assert detail.status_code == listed.status_code == 200
    (row,) = [row for row in listed.json()["results"] if row["id"] == job.pk]
    return detail.json()["env"], row["env"]


def test_a_viewer_reads_env_names_but_no_value(team_setup, job_with_env):
    detail, listed = api_env(team_setup.people[Role.VIEWER], job_with_env)
    assert detail == listed == {"WANDB_API_KEY": None, "BATCH": None}


def test_a_viewer_finds_no_env_value_on_the_dashboard(team_setup, job_with_env):
    browser = Client()
    browser.force_login(team_setup.people[Role.VIEWER].user)
    for path in (f"/jobs/{job_with_env.pk}/", f"/jobs/{job_with_env.pk}/status.json", "/"):
        response = browser.get(path)
        assert response.status_code == 200, path
        assert b"wandb-secret-value" not in response.content, path


@pytest.mark.parametrize("role", [Role.MEMBER, Role.ADMIN])
def test_members_and_admins_of_the_team_read_env_values(team_setup, job_with_env, role):
    assert api_env(team_setup.people[role], job_with_env) == (ENV, ENV)


def test_the_owner_reads_their_jobs_env_after_becoming_a_viewer(team_setup, job_with_env):
    owner = team_setup.people[Role.MEMBER]
    Membership.objects.filter(user=owner.user, team=team_setup.team).update(role=Role.VIEWER)
    assert api_env(owner, job_with_env) == (ENV, ENV)
