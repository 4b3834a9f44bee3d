"""The heartbeat path and the scheduler do the same work with 1,000 subscriptions as
with none: no query of theirs depends on subscriptions (counted, not timed). Sending
happens in a worker after commit; bench/notify.py measures the rest."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from respawn import protocol
from respawn_server.jobs.core.choices import Channel, JobStatus
from respawn_server.jobs.core.choices import NotificationKind as Kind
from respawn_server.jobs.fleet.scheduler import schedule
from respawn_server.jobs.models import Instance, Job, Notification, Subscription
from respawn_server.jobs.money.seed_prices import seed_price_book
from tests.agent_api.helpers import AgentClient
from tests.factories import make_instance, make_job, make_team_with_members

pytestmark = pytest.mark.django_db


def subscribe_everything(team, n=1_000):
    Subscription.objects.bulk_create([
        Subscription(team=team, name=f"s{i}", channel=Channel.SLACK, url="https://hooks.example.com/x",
                     events=list(Kind.SUBSCRIBABLE)) for i in range(n)])


def test_a_heartbeat_makes_the_same_queries_with_1000_subscriptions_as_with_none():
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.PROVISIONING)
    agent = AgentClient()
    agent.register(make_instance(job).bootstrap_token)

    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert agent.post("heartbeat", protocol.Heartbeat(step=1)).status_code == 200
        return len(queries)

    without = count()
    subscribe_everything(setup.team)
    assert count() == without


def test_a_scheduling_pass_makes_the_same_queries_with_1000_subscriptions_as_with_none():
    seed_price_book()
    setup = make_team_with_members()

    def count() -> int:
        make_job(setup.team, setup.people["member"].user, instance_types=["cpu-small"], allowed_clouds=["local"])
        with CaptureQueriesContext(connection) as queries:
            assert len(schedule()) == 1
        Instance.objects.all().delete()  # each pass starts from the same state
        Job.objects.all().delete()
        return len(queries)

    without = count()
    subscribe_everything(setup.team)
    assert count() == without
    assert not Notification.objects.exists()
