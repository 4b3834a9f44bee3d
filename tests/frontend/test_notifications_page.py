"""The team's notifications page and its POSTs: who sees and manages which
subscription, and a refused URL answered with its reason on the page."""

import pytest
from django.test import Client

from respawn_server.jobs.core import secret_env
from respawn_server.jobs.core.choices import Channel, Role
from respawn_server.jobs.core.choices import NotificationKind as Kind
from respawn_server.jobs.models import Delivery, Subscription
from respawn_server.jobs.notify import subscriptions
from tests.factories import make_team_with_members

pytestmark = pytest.mark.django_db


@pytest.fixture
def setup():
    setup = make_team_with_members()
    setup.team_sub = subscriptions.create(team=setup.team, name="ops", channel=Channel.SLACK,
                                          url="https://hooks.example.com/services/T0/B0/SECRETPATH",
                                          events=[Kind.JOB_FAILED])
    return setup


def signed_in(setup, who) -> Client:
    client = Client()
    client.force_login(setup.people[who].user)
    return client


def form(**fields):
    return {"name": "mine", "scope": "personal", "channel": Channel.EMAIL, "url": "", "email": "me@example.com",
            "events": [Kind.JOB_FAILED], "preemption_burst": 3, "recovering_after_min": 30, **fields}


def test_a_viewer_sees_the_teams_subscription_without_its_secret_path_and_cannot_test_it(setup):
    viewer = signed_in(setup, Role.VIEWER)
    page = viewer.get(f"/teams/{setup.team.pk}/notifications/")
    assert page.status_code == 200
    assert b"ops" in page.content and b"hooks.example.com/\xe2\x80\xa6" in page.content
    assert b"SECRETPATH" not in page.content and b"Send test" not in page.content
    assert viewer.post(f"/teams/{setup.team.pk}/notifications/{setup.team_sub.pk}/test/").status_code == 403
    assert viewer.post(f"/teams/{setup.team.pk}/notifications/{setup.team_sub.pk}/delete/").status_code == 403
    assert not Delivery.objects.exists() and Subscription.objects.count() == 1


def test_an_admin_sends_a_test_message_and_it_is_in_the_log(setup):
    admin = signed_in(setup, Role.ADMIN)
    assert admin.post(f"/teams/{setup.team.pk}/notifications/{setup.team_sub.pk}/test/").status_code == 302
    page = admin.get(f"/teams/{setup.team.pk}/notifications/")
    assert b"SECRETPATH" in page.content and b"Test message for subscription" in page.content
    assert Delivery.objects.get().subscription == setup.team_sub


def test_another_team_does_not_exist(setup):
    outsider = signed_in(setup, "outsider")
    assert outsider.get(f"/teams/{setup.team.pk}/notifications/").status_code == 404
    assert outsider.post(f"/teams/{setup.team.pk}/notifications/{setup.team_sub.pk}/test/").status_code == 404
    assert outsider.post(f"/teams/{setup.team.pk}/notifications/new/", form()).status_code == 404


def test_a_member_subscribes_for_themselves_but_not_for_the_team(setup):
    member = signed_in(setup, Role.MEMBER)
    assert member.post(f"/teams/{setup.team.pk}/notifications/new/", form()).status_code == 201
    assert member.post(f"/teams/{setup.team.pk}/notifications/new/", form(scope="team")).status_code == 403
    mine = Subscription.objects.get(name="mine")
    assert mine.user == setup.people[Role.MEMBER].user and mine.recovering_after_s == 1800


def test_a_refused_url_comes_back_with_its_reason(setup):
    admin = signed_in(setup, Role.ADMIN)
    answer = admin.post(f"/teams/{setup.team.pk}/notifications/new/", form(
        channel=Channel.WEBHOOK, email="", url="http://169.254.169.254/latest/meta-data/"))
    assert answer.status_code == 400 and b"link-local" in answer.content
    assert Subscription.objects.count() == 1


def test_a_webhooks_secret_is_on_the_answer_that_makes_it_and_on_no_page_after(setup, settings):
    settings.NOTIFY = {**settings.NOTIFY, "ALLOW_PRIVATE": True}  # a loopback URL: only resolved, never called
    admin = signed_in(setup, Role.ADMIN)
    answer = admin.post(f"/teams/{setup.team.pk}/notifications/new/", form(
        name="hook", channel=Channel.WEBHOOK, email="", url="http://127.0.0.1:9/hook"))
    assert answer.status_code == 201, answer.content
    secret = secret_env.unseal_value(Subscription.objects.get(name="hook").secret)
    assert f'<pre id="secret">{secret}</pre>'.encode() in answer.content
    assert secret.encode() not in admin.get(f"/teams/{setup.team.pk}/notifications/").content
