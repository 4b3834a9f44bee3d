"""Personal API tokens: listed with their use, created and shown once, revoked."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from respawn_server.jobs.core.choices import AuditAction
from respawn_server.jobs.models import ApiToken, AuditEvent
from respawn_server.jobs.people.tokens import hash_token
from tests.api.clients import client_for
from tests.factories import make_team_with_members


@pytest.fixture
def setup(db):
    return make_team_with_members()


def test_it_creates_a_token_shown_once_and_stores_only_its_digest(setup):
    member = setup.people["member"]
    expires = (timezone.now() + timedelta(days=30)).isoformat()
    response = client_for(member).post("/api/v1/tokens/", {"name": "laptop", "expires_at": expires}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    secret = body["token"]
    stored = ApiToken.objects.get(pk=body["id"])
    assert stored.key_hash == hash_token(secret) and secret not in {stored.key_hash, stored.prefix}
    assert secret.startswith(body["prefix"]) and body["expires_at"]
    listed = client_for(member).get("/api/v1/tokens/").json()["results"]
    assert {t["name"] for t in listed} == {"test", "laptop"}
    assert all("token" not in t for t in listed), "a token's secret is shown only when it is created"
    assert APIClient(HTTP_AUTHORIZATION=f"Bearer {secret}").get("/api/v1/jobs/").status_code == 200


def test_the_list_shows_last_use_and_which_token_is_in_use(setup):
    member = setup.people["member"]
    client_for(member).get("/api/v1/jobs/")
    (row,) = client_for(member).get("/api/v1/tokens/").json()["results"]
    assert row["current"] is True and row["last_used_at"] is not None and row["revoked_at"] is None


def test_a_revoked_token_no_longer_opens_anything_and_stays_listed(setup):
    member = setup.people["member"]
    created = client_for(member).post("/api/v1/tokens/", {"name": "ci"}, format="json").json()
    revoked = client_for(member).post(f"/api/v1/tokens/{created['id']}/revoke/")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    assert APIClient(HTTP_AUTHORIZATION=f"Bearer {created['token']}").get("/api/v1/jobs/").status_code == 401
    assert client_for(member).post(f"/api/v1/tokens/{created['id']}/revoke/").status_code == 409
    listed = {t["id"]: t for t in client_for(member).get("/api/v1/tokens/").json()["results"]}
    assert listed[created["id"]]["revoked_at"]


def test_an_expired_token_is_refused_with_a_message_saying_so(setup):
    member = setup.people["member"]
    ApiToken.objects.filter(user=member.user).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = client_for(member).get("/api/v1/jobs/")
    assert response.status_code == 401 and "expired" in response.json()["detail"]


def test_bad_input_names_the_field(setup):
    client = client_for(setup.people["member"])
    past = (timezone.now() - timedelta(days=1)).isoformat()
    response = client.post("/api/v1/tokens/", {"name": "old", "expires_at": past}, format="json")
    assert response.status_code == 400 and "expires_at" in response.json()["errors"]
    assert "name" in client.post("/api/v1/tokens/", {}, format="json").json()["errors"]


def test_another_persons_token_does_not_exist_for_you(setup):
    member_token = ApiToken.objects.get(user=setup.people["member"].user)
    admin = client_for(setup.people["admin"])
    assert admin.get(f"/api/v1/tokens/{member_token.pk}/").status_code == 404
    assert admin.post(f"/api/v1/tokens/{member_token.pk}/revoke/").status_code == 404
    assert ApiToken.objects.get(pk=member_token.pk).revoked_at is None


def test_creating_and_revoking_are_audited_and_login_counts_as_creating(setup):
    member = setup.people["member"]
    created = client_for(member).post("/api/v1/tokens/", {"name": "ci"}, format="json").json()
    client_for(member).post(f"/api/v1/tokens/{created['id']}/revoke/")
    APIClient().post("/api/v1/auth/token/", {"username": member.user.username, "password": "correct horse battery",
                                              "token_name": "cli"}, format="json")
    events = list(AuditEvent.objects.filter(actor=member.user).order_by("id").values_list("action", "details"))
    assert [a for a, _ in events] == [AuditAction.TOKEN_CREATED, AuditAction.TOKEN_REVOKED, AuditAction.TOKEN_CREATED]
    assert events[0][1]["name"] == "ci" and events[2][1]["via"] == "login"
    assert all(created["token"] not in str(details) for _, details in events), "a secret leaked into the audit log"
