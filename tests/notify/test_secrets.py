"""Webhook signing secrets sealed at rest (issue 21): the row holds a token, never the
secret; the secret shown at creation verifies every signature, across a key rotation;
a secret the key no longer opens fails its delivery for good, saying why, and the job
it tells of goes on as if nothing happened. Deliveries run in this process, through
Celery's own apply."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
from cryptography.fernet import Fernet
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from respawn_server.jobs.core import secret_env
from respawn_server.jobs.core.choices import Channel, DeliveryStatus, JobStatus
from respawn_server.jobs.core.choices import NotificationKind as Kind
from respawn_server.jobs.core.transitions import transition_job
from respawn_server.jobs.models import Delivery, Subscription
from respawn_server.jobs.notify import subscriptions
from respawn_server.jobs.tasks import deliver_notification
from tests.api.clients import client_for
from tests.factories import make_job, make_team_with_members

PATH = "/ok/hook"


@pytest.fixture
def key(settings) -> str:
    """A key of this test's own, to replace or rotate."""
    key = Fernet.generate_key().decode()
    settings.RESPAWN = {**settings.RESPAWN, "SECRETS_KEY": key}
    return key


def use_key(settings, keys: str) -> None:
    settings.RESPAWN = {**settings.RESPAWN, "SECRETS_KEY": keys}


@pytest.fixture
def hook(db, key, allow_private, receiver):
    """A team webhook made through the API, its secret (as shown at creation) given to the receiver."""
    setup = make_team_with_members()
    created = client_for(setup.people["admin"]).post("/api/v1/subscriptions/", {
        "team": setup.team.pk, "scope": "team", "name": "hook", "channel": Channel.WEBHOOK,
        "url": receiver.url(PATH), "events": [Kind.JOB_SUCCEEDED]}, format="json")
    assert created.status_code == 201, created.content
    receiver.secrets[PATH] = created.json()["secret"]
    return SimpleNamespace(setup=setup, id=created.json()["id"], secret=created.json()["secret"])


def delivered(delivery_id: int) -> Delivery:
    """The delivery after a worker's attempt at it, which never raises out of the task."""
    assert deliver_notification.apply(args=[delivery_id]).successful()
    return Delivery.objects.get(pk=delivery_id)


def test_the_row_holds_the_secret_only_sealed(hook):
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM jobs_subscription WHERE id = %s", [hook.id])
        row = " ".join(map(str, cursor.fetchone()))
    stored = Subscription.objects.get(pk=hook.id).secret
    assert stored != hook.secret and stored in row and hook.secret not in row
    assert secret_env.unseal_value(stored) == hook.secret


def test_the_signature_verifies_with_the_secret_shown_at_creation(hook, receiver):
    delivery = delivered(subscriptions.send_test(Subscription.objects.get(pk=hook.id), hook.setup.people["admin"].user))
    assert delivery.status == DeliveryStatus.SENT, delivery.last_error
    [message] = receiver.at(PATH)
    assert message.signature_ok is True


def test_a_secret_the_key_no_longer_opens_fails_the_delivery_for_good_saying_why(hook, receiver, settings):
    use_key(settings, Fernet.generate_key().decode())  # the key that sealed it replaced
    job = make_job(hook.setup.team, hook.setup.people["member"].user, status=JobStatus.RUNNING)
    transition_job(job.pk, JobStatus.RUNNING, JobStatus.SUCCEEDED, message="training completed")
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    delivery = delivered(Delivery.objects.get(subscription_id=hook.id).pk)
    assert delivery.status == DeliveryStatus.FAILED and delivery.attempts == 1 and not receiver.received
    subscription = Subscription.objects.get(pk=hook.id)
    assert "signing secret cannot be decrypted" in subscription.failing_reason
    assert "make the subscription again" in subscription.failing_reason and subscription.failing_since
    assert "signing secret cannot be decrypted" in delivery.attempt_log.get().error


def test_a_rotated_key_keeps_signatures_verifiable(hook, key, receiver, settings):
    sealed_before = Subscription.objects.get(pk=hook.id).secret
    new_key = Fernet.generate_key().decode()
    use_key(settings, f"{new_key},{key}")
    said = io.StringIO()
    call_command("rotate_secrets_key", stdout=said)
    assert "1 webhook signing secrets re-encrypted" in said.getvalue()
    use_key(settings, new_key)  # the old key retired
    assert Subscription.objects.get(pk=hook.id).secret != sealed_before
    delivery = delivered(subscriptions.send_test(Subscription.objects.get(pk=hook.id), hook.setup.people["admin"].user))
    assert delivery.status == DeliveryStatus.SENT, delivery.last_error
    assert [message.signature_ok for message in receiver.at(PATH)] == [True]


def test_a_rotation_leaves_a_secret_no_key_opens_and_names_it(hook, settings):
    sealed = Subscription.objects.get(pk=hook.id).secret
    use_key(settings, Fernet.generate_key().decode())
    with pytest.raises(CommandError, match=rf"subscriptions \[{hook.id}\]"):
        call_command("rotate_secrets_key", stdout=io.StringIO())
    assert Subscription.objects.get(pk=hook.id).secret == sealed


@pytest.mark.django_db(transaction=True)
def test_migration_0020_seals_plain_secrets_and_its_reverse_opens_them(key):
    before, after = [("jobs", "0019_instance_standby_for")], [("jobs", "0020_subscription_secret_sealed")]
    plain = "ab" * 32
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    team = old.get_model("jobs", "Team").objects.create(name="t")
    made = old.get_model("jobs", "Subscription").objects.create(team=team, name="hook", channel=Channel.WEBHOOK,
                                                                 url="https://hooks.example.com/x", secret=plain)
    old.get_model("jobs", "Subscription").objects.create(team=team, name="slack", channel=Channel.SLACK,
                                                          url="https://hooks.example.com/y")

    executor = MigrationExecutor(connection)
    executor.migrate(after)
    stored = dict(executor.loader.project_state(after).apps.get_model("jobs", "Subscription").objects
                  .values_list("name", "secret"))
    assert stored["hook"] != plain and secret_env.unseal_value(stored["hook"]) == plain and stored["slack"] == ""

    executor = MigrationExecutor(connection)
    executor.migrate(before)
    assert executor.loader.project_state(before).apps.get_model("jobs", "Subscription").objects.get(
        pk=made.pk).secret == plain
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
