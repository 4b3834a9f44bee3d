"""Webhook URLs our servers would call: refused at save time (a 400 naming `url`) when
not http(s) or when their host resolves to loopback, private or link-local addresses,
and again at send time, when the name may resolve elsewhere."""

from __future__ import annotations

import pytest

from respawn_server.jobs.core.choices import Channel, DeliveryStatus
from respawn_server.jobs.core.choices import NotificationKind as Kind
from respawn_server.jobs.models import Delivery, Subscription
from respawn_server.jobs.notify import subscriptions
from respawn_server.jobs.notify.addresses import UnsafeURL, check_url
from respawn_server.jobs.tasks import deliver_notification
from tests.api.clients import client_for
from tests.factories import make_team_with_members

REFUSED = [
    ("ftp://127.0.0.1/hook", "only http:// and https://"),
    ("file:///etc/passwd", "only http:// and https://"),
    ("javascript:alert(1)", "only http:// and https://"),
    ("http:///hook", "names no host"),
    ("http://127.0.0.1:99999/hook", "port"),
    ("http://127.0.0.1/hook", "loopback"),
    ("http://localhost:8000/hook", "loopback"),
    ("http://[::1]/hook", "loopback"),
    ("http://10.1.2.3/hook", "private"),
    ("http://192.168.0.10/hook", "private"),
    ("http://172.16.5.4/hook", "private"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://[::ffff:169.254.169.254]/latest/meta-data/", "link-local"),
    ("http://[fd00:ec2::254]/latest/meta-data/", "metadata"),
    ("http://0.0.0.0/hook", "not an address"),
    ("http://no-such-host.invalid/hook", "does not resolve"),
]


@pytest.mark.parametrize("url,why", REFUSED, ids=[u for u, _ in REFUSED])
def test_it_refuses(url, why, settings):
    settings.NOTIFY = {**settings.NOTIFY, "ALLOW_PRIVATE": False}
    with pytest.raises(UnsafeURL, match=why):
        check_url(url)


@pytest.mark.parametrize("url", ["http://169.254.169.254/latest/meta-data/", "http://[fd00:ec2::254]/",
                                 "ftp://127.0.0.1/"])
def test_allowing_private_addresses_never_allows_the_metadata_service(url, allow_private):
    with pytest.raises(UnsafeURL):
        check_url(url)


def test_allowing_private_addresses_allows_loopback(allow_private):
    check_url("http://127.0.0.1:8000/hook")
    check_url("http://10.1.2.3/hook")


@pytest.mark.django_db
@pytest.mark.parametrize("url,why", [("http://169.254.169.254/x", "link-local"), ("gopher://example.com/", "http"),
                                     ("http://127.0.0.1/x", "loopback")])
def test_the_api_answers_a_400_naming_url(url, why):
    setup = make_team_with_members()
    response = client_for(setup.people["member"]).post("/api/v1/subscriptions/", {
        "team": setup.team.pk, "name": "hook", "channel": Channel.WEBHOOK, "url": url, "events": [Kind.JOB_FAILED],
    }, format="json")
    assert response.status_code == 400, response.content
    assert why in " ".join(response.json()["errors"]["url"])
    assert not Subscription.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("body,field", [
    ({"channel": Channel.EMAIL, "events": [Kind.JOB_FAILED]}, "email"),
    ({"channel": Channel.SLACK, "events": [Kind.JOB_FAILED]}, "url"),
    ({"channel": Channel.EMAIL, "email": "a@example.com", "events": []}, "events"),
    ({"channel": Channel.EMAIL, "email": "a@example.com", "events": ["job.exploded"]}, "events"),
    ({"channel": Channel.EMAIL, "email": "a@example.com", "events": "job.failed"}, "events"),
    ({"channel": "pigeon", "email": "a@example.com", "events": [Kind.JOB_FAILED]}, "channel"),
    ({"channel": Channel.EMAIL, "email": "not an address", "events": [Kind.JOB_FAILED]}, "email"),
    ({"channel": Channel.EMAIL, "email": "a@example.com", "events": [Kind.JOB_FAILED], "preemption_burst": 0},
     "preemption_burst"),
    ({"channel": Channel.EMAIL, "email": "a@example.com", "events": [Kind.JOB_FAILED], "secret": "mine"}, "secret"),
    ({"channel": Channel.EMAIL, "email": "a@example.com", "events": [Kind.JOB_FAILED], "scope": "world"}, "scope"),
    ({"channel": Channel.EMAIL, "email": "a@example.com", "events": [Kind.JOB_FAILED], "name": "x\x00"}, "name"),
])
def test_bad_input_is_a_400_naming_the_field(body, field):
    setup = make_team_with_members()
    response = client_for(setup.people["admin"]).post("/api/v1/subscriptions/", {
        "team": setup.team.pk, "name": "n", **body}, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()


@pytest.mark.django_db
def test_a_url_that_became_refused_since_it_was_saved_fails_at_send_time_without_retries(settings, receiver):
    setup = make_team_with_members()
    settings.NOTIFY = {**settings.NOTIFY, "ALLOW_PRIVATE": True}
    sub = subscriptions.create(team=setup.team, name="hook", channel=Channel.WEBHOOK, url=receiver.url("/ok/a"),
                               events=[Kind.JOB_FAILED])
    delivery_id = subscriptions.send_test(sub, setup.people["admin"].user)
    settings.NOTIFY = {**settings.NOTIFY, "ALLOW_PRIVATE": False}  # as if the name now resolved inside
    deliver_notification.apply(args=[delivery_id])
    delivery = Delivery.objects.get(pk=delivery_id)
    assert delivery.status == DeliveryStatus.FAILED and delivery.attempts == 1
    assert "loopback" in delivery.last_error and not receiver.received
    sub.refresh_from_db()
    assert "loopback" in sub.failing_reason
