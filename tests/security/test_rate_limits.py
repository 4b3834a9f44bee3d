"""Password guessing and token minting are rate limited, per address and per
person, and a client cannot dodge the limit with a made-up X-Forwarded-For."""

from __future__ import annotations

from django.test import Client
from rest_framework.test import APIClient

from tests.api.clients import client_for

LOGIN_LIMIT = 20  # settings: "login": "20/min"
TOKEN_LIMIT = 30  # settings: "token_create": "30/hour"


def api_login(client, password="wrong", **headers):
    return client.post("/api/v1/auth/token/", {"username": "vision-admin", "password": password,
                                                "token_name": "cli"}, format="json", **headers)


def test_api_login_is_refused_with_429_after_the_limit_even_with_the_right_password(team_setup):
    client = APIClient()
    answers = [api_login(client).status_code for _ in range(LOGIN_LIMIT)]
    assert answers == [401] * LOGIN_LIMIT
    refused = api_login(client, password="correct horse battery")
    assert refused.status_code == 429
    assert "throttled" in refused.json()["detail"]


def test_a_made_up_forwarded_for_header_does_not_reset_the_limit(team_setup):
    client = APIClient()
    for n in range(LOGIN_LIMIT):
        assert api_login(client, HTTP_X_FORWARDED_FOR=f"10.0.0.{n}").status_code == 401
    assert api_login(client, HTTP_X_FORWARDED_FOR="10.9.9.9").status_code == 429


def test_dashboard_sign_in_counts_against_the_same_limit(team_setup):
    page = Client()
    for _ in range(LOGIN_LIMIT):
        assert page.post("/login/", {"username": "vision-admin", "password": "wrong"}).status_code == 200
    refused = page.post("/login/", {"username": "vision-admin", "password": "correct horse battery"})
    assert refused.status_code == 429
    assert "Too many sign-in attempts" in refused.content.decode()
    assert api_login(APIClient(), password="correct horse battery").status_code == 429


def test_minting_tokens_is_limited_per_person_while_listing_stays_open(team_setup):
    admin = client_for(team_setup.people["admin"])
    for n in range(TOKEN_LIMIT):
        assert admin.post("/api/v1/tokens/", {"name": f"t{n}"}, format="json").status_code == 201
    assert admin.post("/api/v1/tokens/", {"name": "one more"}, format="json").status_code == 429
    assert admin.get("/api/v1/tokens/").status_code == 200
    # Another person's budget is their own.
    member = client_for(team_setup.people["member"])
    assert member.post("/api/v1/tokens/", {"name": "mine"}, format="json").status_code == 201
