"""`respawn notify` (issue 21), run as a user would against a live control plane: a
subscription made, listed, tested, switched off and on and deleted; the delivery log
with each attempt; the server's refusals named by the flag that set the field.
Deliveries are attempted in this process (Celery's own apply), as a worker would."""

import json
import re
import subprocess

import pytest

from respawn_server.jobs.models import Delivery, Subscription
from respawn_server.jobs.tasks import deliver_notification
from tests.cli.test_cli_live import RESPAWN, cli  # noqa: F401  (cli: a fixture)
from tests.conftest import share_secrets_key
from tests.notify.receiver import Receiver

pytestmark = pytest.mark.store_incidental


@pytest.fixture
def child_env(child_env, settings):
    """The server takes the test receiver's 127.0.0.1 and seals with the key this test signs with."""
    child_env["RESPAWN_NOTIFY_ALLOW_PRIVATE"] = "1"
    settings.NOTIFY = {**settings.NOTIFY, "ALLOW_PRIVATE": True}
    return share_secrets_key(child_env, settings)


@pytest.fixture
def receiver():
    with Receiver() as running:
        yield running


def deliver_all() -> None:
    for delivery_id in Delivery.objects.values_list("pk", flat=True):
        deliver_notification.apply(args=[delivery_id])


def test_a_webhook_gets_its_secret_shown_once_and_its_test_message_is_signed_and_logged(cli, receiver):  # noqa: F811
    added = cli("notify", "add", "--channel", "webhook", "--to", receiver.url("/ok/hook"),
                "--events", "job.failed,job.succeeded")
    assert added.returncode == 0, added.stderr
    sub_id = int(re.search(r"subscription (\d+) 'webhook: 127\.0\.0\.1'", added.stdout)[1])
    secret = re.search(r"(?m)^signing secret: ([0-9a-f]{64})$", added.stdout)[1]
    assert "only time the secret is shown" in added.stderr
    receiver.secrets["/ok/hook"] = secret

    listed = cli("notify")  # list, the default
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0].split()[:4] == ["ID", "TEAM", "NAME", "FOR"]
    assert re.search(rf"(?m)^{sub_id}\s.*vision-member\s+webhook\s.*job\.failed job\.succeeded\s+yes", listed.stdout)
    as_json = json.loads(cli("notify", "list", "--json").stdout)
    assert [row["id"] for row in as_json] == [sub_id] and secret not in json.dumps(as_json)

    tested = cli("notify", "test", str(sub_id))
    assert tested.returncode == 0, tested.stderr
    delivery_id = int(re.search(r"delivery (\d+) \(pending\)", tested.stdout)[1])
    deliver_all()
    [message] = receiver.at("/ok/hook")
    assert message.signature_ok is True  # signed with the secret shown at creation, sealed since

    log = cli("notify", "deliveries", "--subscription", str(sub_id))
    assert log.returncode == 0, log.stderr
    assert re.search(rf"(?m)^{delivery_id}\s+{sub_id}\s+test\s+-\s+sent\s+1\s.*\s200\s+-$", log.stdout), log.stdout
    [logged] = json.loads(cli("notify", "deliveries", "--status", "sent", "--json").stdout)
    assert logged["id"] == delivery_id and [a["status_code"] for a in logged["attempt_log"]] == [200]


def test_each_attempt_of_a_failing_delivery_has_its_line(cli, receiver):  # noqa: F811
    added = cli("notify", "add", "--channel", "slack", "--to", receiver.url("/fail/slack"), "--events", "job.failed",
                "--name", "on-call")
    assert added.returncode == 0 and "secret" not in added.stdout + added.stderr, added.stderr
    sub_id = Subscription.objects.get(name="on-call").pk
    assert cli("notify", "test", str(sub_id)).returncode == 0
    deliver_all()
    tries = len(receiver.at("/fail/slack"))
    assert tries > 1
    log = cli("notify", "deliveries", "--status", "failed")
    assert log.returncode == 0, log.stderr
    lines = [line for line in log.stdout.splitlines()[1:] if "HTTP 500" in line]  # no answer kept from loopback
    assert [int(line.split()[5]) for line in lines] == list(range(1, tries + 1)), log.stdout
    assert cli("notify", "deliveries", "--status", "pending").stdout == "no deliveries match\n"


def test_disable_enable_and_rm(cli):  # noqa: F811
    added = cli("notify", "add", "--channel", "email", "--email", "me@example.com", "--events", "job.failed")
    assert added.returncode == 0, added.stderr
    sub = Subscription.objects.get()
    disabled = cli("notify", "disable", str(sub.pk))
    assert disabled.returncode == 0 and f"subscription {sub.pk} 'email: me@example.com' disabled" in disabled.stdout
    assert Subscription.objects.get().enabled is False
    assert cli("notify", "enable", str(sub.pk)).returncode == 0 and Subscription.objects.get().enabled is True
    removed = cli("notify", "rm", str(sub.pk))
    assert removed.returncode == 0 and "deleted" in removed.stdout and not Subscription.objects.exists()
    again = cli("notify", "rm", str(sub.pk))
    assert again.returncode == 4 and "not found" in again.stderr


def test_the_servers_refusals_are_named_by_flag_and_exit_non_zero(cli):  # noqa: F811
    metadata = cli("notify", "add", "--channel", "webhook", "--to", "http://169.254.169.254/latest/meta-data/",
                   "--events", "job.failed")
    assert metadata.returncode == 2 and "nothing was made" in metadata.stderr
    assert re.search(r"(?m)^  --to: .*link-local", metadata.stderr), metadata.stderr
    no_address = cli("notify", "add", "--channel", "email", "--events", "job.failed")
    assert no_address.returncode == 2 and "--email: an email subscription needs an address" in no_address.stderr
    not_admin = cli("notify", "add", "--channel", "email", "--email", "ops@example.com", "--events", "job.failed",
                    "--team-wide")
    assert not_admin.returncode == 1 and "not allowed: only the team's admins" in not_admin.stderr
    unknown = cli("notify", "add", "--channel", "email", "--email", "ops@example.com", "--events", "job.exploded")
    assert unknown.returncode == 2 and "job.exploded: not an event; the events are job.succeeded" in unknown.stderr
    assert not Subscription.objects.exists()


def test_notify_help_lists_the_actions_and_the_events():
    actions = subprocess.run([str(RESPAWN), "notify", "--help"], capture_output=True, text=True)
    assert actions.returncode == 0
    assert all(action in actions.stdout for action in ("list", "add", "test", "deliveries", "rm", "disable", "enable"))
    add = subprocess.run([str(RESPAWN), "notify", "add", "--help"], capture_output=True, text=True)
    assert add.returncode == 0 and "checkpoint.invalid" in add.stdout and "--team-wide" in add.stdout
