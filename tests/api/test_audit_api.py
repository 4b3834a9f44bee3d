"""The audit log: who submitted, cancelled, changed a limit or a member, and
when; readable by team admins only, filtered by action and actor."""

import pytest

from respawn_server.jobs.core.choices import AuditAction
from tests.api.clients import client_for
from tests.factories import make_job, make_team_with_members


@pytest.fixture
def setup(db):
    return make_team_with_members()


def submit(setup, who="member"):
    body = {"team": setup.team.pk, "name": "bert", "command": ["python", "train.py"]}
    return client_for(setup.people[who]).post("/api/v1/jobs/", body, format="json").json()


def test_submitting_and_cancelling_are_recorded_with_who_and_which_job(setup):
    job = submit(setup)
    client_for(setup.people["admin"]).post(f"/api/v1/jobs/{job['id']}/cancel/")
    rows = client_for(setup.people["admin"]).get("/api/v1/audit/").json()["results"]
    assert [(r["actor"], r["action"], r["target"], r["team"]) for r in rows] == [
        ("vision-admin", AuditAction.JOB_CANCELLED, f"job:{job['id']}", setup.team.pk),
        ("vision-member", AuditAction.JOB_SUBMITTED, f"job:{job['id']}", setup.team.pk),
    ]
    assert rows[1]["details"] == {"name": "bert"} and rows[0]["created_at"] >= rows[1]["created_at"]


def test_a_refused_cancel_is_not_recorded(setup):
    job = make_job(setup.team, setup.people["member"].user, status="succeeded")
    assert client_for(setup.people["admin"]).post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 409
    assert client_for(setup.people["admin"]).get("/api/v1/audit/").json()["count"] == 0


def test_filters_by_action_and_actor(setup):
    submit(setup, "member")
    submit(setup, "admin")
    admin = client_for(setup.people["admin"])
    client_for(setup.people["admin"]).patch(f"/api/v1/teams/{setup.team.pk}/limits/", {"max_concurrent_gpus": 2},
                                            format="json")
    by_member = admin.get("/api/v1/audit/?actor=vision-member").json()["results"]
    assert [r["action"] for r in by_member] == [AuditAction.JOB_SUBMITTED]
    limits = admin.get(f"/api/v1/audit/?action={AuditAction.LIMITS_CHANGED}").json()["results"]
    assert [r["actor"] for r in limits] == ["vision-admin"]
    both = admin.get(f"/api/v1/audit/?action={AuditAction.LIMITS_CHANGED}&action={AuditAction.JOB_SUBMITTED}")
    assert both.json()["count"] == 3
    bad = admin.get("/api/v1/audit/?action=job.exploded")
    assert bad.status_code == 400 and "action" in bad.json()["errors"]


def test_only_admins_read_it_and_only_for_their_teams(setup):
    submit(setup)
    assert client_for(setup.people["member"]).get("/api/v1/audit/").status_code == 403
    assert client_for(setup.people["viewer"]).get("/api/v1/audit/").status_code == 403
    assert client_for(setup.people["outsider"]).get("/api/v1/audit/").json()["count"] == 0


def test_admins_see_their_own_token_events_but_no_members(setup):
    client_for(setup.people["viewer"]).post("/api/v1/tokens/", {"name": "laptop"}, format="json")
    client_for(setup.people["admin"]).post("/api/v1/tokens/", {"name": "desk"}, format="json")
    rows = client_for(setup.people["admin"]).get("/api/v1/audit/").json()["results"]
    assert [(r["actor"], r["action"], r["team"]) for r in rows] == [("vision-admin", AuditAction.TOKEN_CREATED, None)]
