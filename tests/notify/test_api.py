"""/api/v1/subscriptions/ and /api/v1/deliveries/: who manages which subscription,
who sees what, and the secret shown once."""

from __future__ import annotations

import pytest

from respawn_server.jobs.core import secret_env
from respawn_server.jobs.core.choices import Channel
from respawn_server.jobs.core.choices import NotificationKind as Kind
from respawn_server.jobs.models import Delivery, Subscription
from respawn_server.jobs.notify import subscriptions
from tests.api.clients import client_for
from tests.factories import make_team_with_members

pytestmark = pytest.mark.django_db

URL = "/api/v1/subscriptions/"


@pytest.fixture
def setup():
    return make_team_with_members()


def webhook(setup, scope, url, who="admin"):
    return client_for(setup.people[who]).post(URL, {
        "team": setup.team.pk, "scope": scope, "name": f"{scope} hook", "channel": Channel.WEBHOOK, "url": url,
        "events": [Kind.JOB_FAILED, Kind.JOB_FAILED, Kind.JOB_SUCCEEDED]}, format="json")


def test_the_secret_is_shown_once_on_creation_and_never_again(setup, allow_private, receiver):
    created = webhook(setup, "team", receiver.url("/ok/team"))
    assert created.status_code == 201, created.content
    secret = created.json()["secret"]
    assert len(secret) == 64 and secret_env.unseal_value(Subscription.objects.get().secret) == secret
    assert created.json()["events"] == [Kind.JOB_FAILED, Kind.JOB_SUCCEEDED] and created.json()["owner"] is None
    again = client_for(setup.people["admin"]).get(f"{URL}{created.json()['id']}/").json()
    listed = client_for(setup.people["admin"]).get(URL).json()["results"]
    assert "secret" not in again and all("secret" not in row for row in listed)
    assert secret not in str(again) + str(listed)


def test_a_viewer_cannot_manage_the_teams_subscriptions_but_may_have_their_own(setup, allow_private, receiver):
    refused = webhook(setup, "team", receiver.url("/ok/v"), who="viewer")
    assert refused.status_code == 403
    own = webhook(setup, "personal", receiver.url("/ok/v"), who="viewer")
    assert own.status_code == 201 and own.json()["owner"] == setup.people["viewer"].user.username
    team_sub = webhook(setup, "team", receiver.url("/ok/secret-path"), who="admin").json()
    viewer = client_for(setup.people["viewer"])
    seen = viewer.get(f"{URL}{team_sub['id']}/").json()
    assert seen["url"].endswith("127.0.0.1/…") and "secret-path" not in seen["url"]  # a Slack URL is its secret
    assert viewer.patch(f"{URL}{team_sub['id']}/", {"enabled": False}, format="json").status_code == 403
    assert viewer.delete(f"{URL}{team_sub['id']}/").status_code == 403
    assert viewer.post(f"{URL}{team_sub['id']}/test/").status_code == 403
    assert viewer.patch(f"{URL}{own.json()['id']}/", {"enabled": False}, format="json").status_code == 200


def test_a_persons_subscription_is_theirs_alone(setup):
    mine = subscriptions.create(team=setup.team, user=setup.people["member"].user, name="mine",
                                channel=Channel.EMAIL, email="me@example.com", events=[Kind.JOB_FAILED])
    admin = client_for(setup.people["admin"])
    assert admin.get(f"{URL}{mine.pk}/").status_code == 404
    assert mine.pk not in [row["id"] for row in admin.get(URL).json()["results"]]
    assert admin.delete(f"{URL}{mine.pk}/").status_code == 404


def test_another_team_sees_nothing(setup):
    sub = subscriptions.create(team=setup.team, name="ops", channel=Channel.EMAIL, email="ops@example.com",
                               events=[Kind.JOB_FAILED])
    delivery_id = subscriptions.send_test(sub, setup.people["admin"].user)
    outsider = client_for(setup.people["outsider"])
    assert outsider.get(URL).json()["results"] == []
    assert outsider.get(f"{URL}{sub.pk}/").status_code == 404
    assert outsider.post(f"{URL}{sub.pk}/test/").status_code == 404
    assert outsider.get("/api/v1/deliveries/").json()["results"] == []
    assert outsider.get(f"/api/v1/deliveries/{delivery_id}/").status_code == 404
    refused = outsider.post(URL, {"team": setup.team.pk, "scope": "personal", "name": "x", "channel": Channel.EMAIL,
                                  "email": "x@example.com", "events": [Kind.JOB_FAILED]}, format="json")
    assert refused.status_code == 400 and "team" in refused.json()["errors"]


def test_a_test_message_is_a_delivery_in_the_log(setup):
    sub = subscriptions.create(team=setup.team, name="ops", channel=Channel.EMAIL, email="ops@example.com",
                               events=[Kind.JOB_FAILED])
    answer = client_for(setup.people["admin"]).post(f"{URL}{sub.pk}/test/")
    assert answer.status_code == 202 and answer.json()["kind"] == Kind.TEST and answer.json()["status"] == "pending"
    log = client_for(setup.people["viewer"]).get("/api/v1/deliveries/", {"subscription": sub.pk}).json()["results"]
    assert [row["id"] for row in log] == [answer.json()["id"]] == [Delivery.objects.get().pk]


def test_a_subscription_cannot_change_channel_or_team(setup):
    sub = subscriptions.create(team=setup.team, name="ops", channel=Channel.EMAIL, email="ops@example.com",
                               events=[Kind.JOB_FAILED])
    admin = client_for(setup.people["admin"])
    moved = admin.patch(f"{URL}{sub.pk}/", {"team": setup.other_team.pk}, format="json")
    assert moved.status_code == 400 and "team" in moved.json()["errors"]
    changed = admin.patch(f"{URL}{sub.pk}/", {"channel": Channel.SLACK, "url": "https://hooks.example.com/x",
                                              "email": ""}, format="json")
    assert changed.status_code == 400 and "channel" in changed.json()["errors"]


def test_the_schema_describes_the_notification_endpoints(client):
    paths = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()["paths"]
    assert {"/api/v1/subscriptions/", "/api/v1/subscriptions/{id}/test/", "/api/v1/deliveries/"} <= set(paths)
