"""The personal API tokens page × every role × own token / someone else's /
anonymous. Tokens are a person's, not a team's ("token.manage" is open to anyone
signed in), so ownership, not role, decides: another person's token is a 404."""

import re

import pytest
from django.test import Client

from respawn_server.jobs.core.choices import AuditAction, Role
from respawn_server.jobs.models import ApiToken, AuditEvent
from respawn_server.jobs.people.permissions import role_allows
from respawn_server.jobs.people.tokens import hash_token
from tests.factories import make_team_with_members

WHO = [Role.VIEWER, Role.MEMBER, Role.ADMIN, "outsider", "anonymous"]
OWNER = Role.MEMBER  # whose token the revoke rows aim at


def signed_in(person=None, **kwargs) -> Client:
    client = Client(**kwargs)
    if person is not None:
        client.force_login(person.user)
    return client


def shown_secret(response) -> str:
    return re.search(r'id="new-token-value"[^>]*value="([^"]+)"', response.content.decode()).group(1)


@pytest.mark.parametrize("who", WHO)
def test_tokens_page_lists_only_your_own_tokens(db, who):
    setup = make_team_with_members()
    ApiToken.objects.filter(user=setup.people[OWNER].user).update(name="members-laptop")
    response = signed_in(setup.people.get(who)).get("/tokens/")
    if who == "anonymous":
        assert response.status_code == 302 and response["Location"].startswith("/login/")
        return
    role_in_team = who if who in Role.ALL else None  # the outsider has no role in this team
    assert response.status_code == (200 if role_allows(role_in_team, "token.manage") else 403)
    assert (b"members-laptop" in response.content) == (who == OWNER), "another person's token leaked"


@pytest.mark.parametrize("who", WHO)
def test_creating_a_token_matrix(db, who):
    setup = make_team_with_members()
    count = ApiToken.objects.count()
    response = signed_in(setup.people.get(who)).post("/tokens/new/", {"name": "ci", "expires_in_days": "30"})
    if who == "anonymous":
        assert response.status_code == 302 and response["Location"].startswith("/login/")
        assert ApiToken.objects.count() == count
        return
    assert response.status_code == 201
    created = ApiToken.objects.get(name="ci")
    assert created.user == setup.people[who].user
    event = AuditEvent.objects.get(action=AuditAction.TOKEN_CREATED)
    assert (event.actor_username, event.details["via"]) == (f"vision-{who}", "dashboard")


@pytest.mark.parametrize("who", WHO)
def test_revoking_a_token_matrix(db, who):
    setup = make_team_with_members()
    target = ApiToken.objects.get(user=setup.people[OWNER].user)
    response = signed_in(setup.people.get(who)).post(f"/tokens/{target.pk}/revoke/")
    target.refresh_from_db()
    if who == OWNER:
        assert response.status_code == 302 and response["Location"] == "/tokens/"
        assert target.revoked_at is not None
        assert AuditEvent.objects.get(action=AuditAction.TOKEN_REVOKED).actor_username == "vision-member"
        return
    expected = 302 if who == "anonymous" else 404  # someone else's token does not exist for you
    assert response.status_code == expected
    assert target.revoked_at is None and not AuditEvent.objects.exists()


def test_the_new_token_is_shown_once_stored_hashed_and_works(db):
    setup = make_team_with_members()
    browser = signed_in(setup.people[Role.VIEWER])
    response = browser.post("/tokens/new/", {"name": "laptop", "expires_in_days": ""})
    secret = shown_secret(response)
    assert "no-store" in response["Cache-Control"]
    created = ApiToken.objects.get(name="laptop")
    assert created.key_hash == hash_token(secret) and secret.startswith(created.prefix)
    assert created.expires_at is None
    assert not ApiToken.objects.filter(key_hash=secret).exists()
    assert secret not in str(AuditEvent.objects.get(action=AuditAction.TOKEN_CREATED).details)
    listed = browser.get("/tokens/").content.decode()
    assert secret not in listed and "laptop" in listed and created.prefix in listed
    api = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert [t["name"] for t in api.get("/api/v1/tokens/").json()["results"]] == ["laptop", "test"]


def test_a_revoked_token_no_longer_opens_the_api_and_shows_as_revoked(db):
    setup = make_team_with_members()
    browser = signed_in(setup.people[Role.VIEWER])
    secret = shown_secret(browser.post("/tokens/new/", {"name": "laptop"}))
    created = ApiToken.objects.get(name="laptop")
    page = browser.post(f"/tokens/{created.pk}/revoke/", follow=True).content.decode()
    assert "Token laptop" in page and "revoked." in page
    row = page[page.index(f'data-token="{created.pk}"'):]
    assert f'action="/tokens/{created.pk}/revoke/"' not in row.split("</tr>")[0]
    assert Client(HTTP_AUTHORIZATION=f"Bearer {secret}").get("/api/v1/tokens/").status_code == 401
    again = browser.post(f"/tokens/{created.pk}/revoke/", follow=True).content.decode()
    assert "was already revoked" in again
    assert AuditEvent.objects.filter(action=AuditAction.TOKEN_REVOKED).count() == 1


def test_an_expiry_in_days_is_stored_and_shown(db):
    setup = make_team_with_members()
    browser = signed_in(setup.people[Role.VIEWER])
    browser.post("/tokens/new/", {"name": "month", "expires_in_days": "30"})
    created = ApiToken.objects.get(name="month")
    assert 29 <= (created.expires_at - created.created_at).days <= 30
    assert created.expires_at.strftime("%Y-%m-%d") in browser.get("/tokens/").content.decode()


@pytest.mark.parametrize("body,message", [
    ({"name": "", "expires_in_days": "3"}, "This field is required."),
    ({"name": "x" * 101}, "Ensure this value has at most 100 characters"),
    ({"name": "old", "expires_in_days": "0"}, "greater than or equal to 1"),
    ({"name": "soon", "expires_in_days": "soon"}, "Enter a whole number."),
])
def test_a_bad_token_request_is_refused_by_field_and_nothing_is_created(db, body, message):
    setup = make_team_with_members()
    count = ApiToken.objects.count()
    response = signed_in(setup.people[Role.VIEWER]).post("/tokens/new/", body)
    assert response.status_code == 400 and message in response.content.decode()
    assert 'id="new-token-value"' not in response.content.decode()
    assert ApiToken.objects.count() == count


def test_the_header_links_to_the_tokens_page(db):
    setup = make_team_with_members()
    assert b'href="/tokens/"' in signed_in(setup.people[Role.VIEWER]).get("/").content


def _token_changes(own):
    """Whether a CSRF-tested POST took effect: the token minted or the own token revoked."""
    own.refresh_from_db()
    return ApiToken.objects.filter(name="csrf").exists(), own.revoked_at is not None


@pytest.mark.parametrize("action,success", [("new", 201), ("revoke", 302)])
def test_token_posts_need_the_csrf_token(db, action, success):
    setup = make_team_with_members()
    own = ApiToken.objects.get(user=setup.people[Role.VIEWER].user)
    url, body = ("/tokens/new/", {"name": "csrf"}) if action == "new" else (f"/tokens/{own.pk}/revoke/", {})
    browser = signed_in(setup.people[Role.VIEWER], enforce_csrf_checks=True)
    assert browser.post(url, body).status_code == 403
    assert _token_changes(own) == (False, False)
    browser.get("/tokens/")  # sets the CSRF cookie, as a browser's visit would
    assert browser.post(url, {**body, "csrfmiddlewaretoken": browser.cookies["csrftoken"].value}).status_code == success
    assert _token_changes(own) == (action == "new", action == "revoke")


def test_minting_on_the_page_counts_against_the_apis_per_person_limit(db):
    limit = 30  # settings: "token_create": "30/hour"
    setup = make_team_with_members()
    person = setup.people[Role.VIEWER]
    browser, api = signed_in(person), Client(HTTP_AUTHORIZATION=f"Bearer {person.token}")
    for n in range(limit // 2):
        assert browser.post("/tokens/new/", {"name": f"page-{n}"}).status_code == 201
        assert api.post("/api/v1/tokens/", {"name": f"api-{n}"}, content_type="application/json").status_code == 201
    count = ApiToken.objects.count()
    refused = browser.post("/tokens/new/", {"name": "one-too-many"})
    assert refused.status_code == 429 and b"Too many tokens created" in refused.content
    assert api.post("/api/v1/tokens/", {"name": "api-too"}, content_type="application/json").status_code == 429
    assert ApiToken.objects.count() == count
    assert browser.get("/tokens/").status_code == 200  # listing stays open
