"""Webhooks against a hostile network (issue 35): a name that answers a public address to
the check and 127.0.0.1 to the connect (DNS rebinding) reaches nothing on loopback and
brings no answer back; TLS still names and verifies the host while the connection goes
to the address that was checked; and what failed is told by its kind, never in words
that carry the URL, whose path is a Slack webhook's secret.

The network's edge is stood in for here, nothing of ours: `socket.getaddrinfo` answers
as a test's resolver says, and `socket.connect` refuses every address but loopback, so
no byte leaves 127.0.0.1 whatever address a check chose."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import pytest

from respawn_server.jobs.core.choices import Channel, DeliveryStatus
from respawn_server.jobs.core.choices import NotificationKind as Kind
from respawn_server.jobs.models import Delivery, Subscription
from respawn_server.jobs.notify import sending, subscriptions
from tests.api.clients import client_for
from tests.emulators.azure_compute import _self_signed_context
from tests.factories import make_team_with_members
from tests.notify.receiver import Receiver

PUBLIC = "93.184.215.14"  # a global address: what the name shows the check
CREDENTIALS = b'{"AccessKeyId": "ASIA-FAKE", "SecretAccessKey": "fake-metadata-secret"}'

pytestmark = pytest.mark.django_db


class Network:
    """The resolver and the wire: `answers[name]` are the addresses successive lookups of
    `name` get (the last one from then on); every connection off loopback is refused and
    remembered."""

    def __init__(self, monkeypatch):
        self.answers: dict[str, list[str]] = {}
        self.asked: list[tuple[str, str]] = []
        self.refused: list[tuple] = []
        real_getaddrinfo, real_connect = socket.getaddrinfo, socket.socket.connect

        def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
            answers = self.answers.get(host)
            if answers is None:
                return real_getaddrinfo(host, port, family, type, proto, flags)
            address = answers.pop(0) if len(answers) > 1 else answers[0]
            self.asked.append((host, address))
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, int(port or 0)))]

        def connect(sock, address):
            if sock.family in (socket.AF_INET, socket.AF_INET6) and not address[0].startswith("127."):
                self.refused.append(address[:2])
                raise ConnectionRefusedError(111, "Connection refused")
            return real_connect(sock, address)

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        monkeypatch.setattr(socket.socket, "connect", connect)


@pytest.fixture
def network(monkeypatch):
    return Network(monkeypatch)


@pytest.fixture
def setup():
    return make_team_with_members()


def attempted(sub: Subscription, setup) -> Delivery:
    """One last attempt at a test message to `sub`, as a worker makes it."""
    delivery_id = subscriptions.send_test(sub, setup.people["admin"].user)
    sending.attempt(delivery_id, last=True)
    return Delivery.objects.get(pk=delivery_id)


def told(delivery: Delivery) -> str:
    """Every text the delivery log and its subscription show about the failure."""
    sub = Subscription.objects.get(pk=delivery.subscription_id)
    return " | ".join([delivery.last_error, sub.failing_reason, *(a.error for a in delivery.attempt_log.all())])


def test_a_name_rebound_to_loopback_after_the_check_reaches_nothing_there(setup, network, settings):
    settings.NOTIFY = {**settings.NOTIFY, "ALLOW_PRIVATE": False}
    with Receiver(failure_body=CREDENTIALS) as metadata:  # a metadata service's stand-in, on loopback
        port = metadata.server.server_address[1]
        network.answers["rebind.test"] = [PUBLIC, "127.0.0.1"]
        # A viewer's own subscription: all a viewer needs to make the control plane send.
        sub = subscriptions.create(team=setup.team, user=setup.people["viewer"].user, name="mine",
                                   channel=Channel.WEBHOOK, url=f"http://rebind.test:{port}/fail/latest/meta-data/",
                                   events=[Kind.JOB_FAILED])
        delivery = attempted(sub, setup)
    assert metadata.received == []
    assert network.refused == [(PUBLIC, port)]  # it connected to the address it had checked, and only there
    assert delivery.status == DeliveryStatus.FAILED and "connection refused" in delivery.last_error
    assert "fake-metadata-secret" not in told(delivery)


def test_an_answer_from_an_address_that_is_not_public_is_never_stored(setup, settings):
    # A deployment that allows private addresses still reads nothing back from them.
    settings.NOTIFY = {**settings.NOTIFY, "ALLOW_PRIVATE": True}
    with Receiver(failure_body=CREDENTIALS) as internal:
        sub = subscriptions.create(team=setup.team, name="internal", channel=Channel.WEBHOOK,
                                   url=internal.url("/fail/x"), events=[Kind.JOB_FAILED])
        delivery = attempted(sub, setup)
    assert len(internal.received) == 1 and delivery.attempt_log.get().status_code == 500
    assert delivery.last_error == "HTTP 500" and "fake-metadata-secret" not in told(delivery)


def test_the_request_names_the_host_and_its_credentials_as_the_url_does(setup, network, settings):
    settings.NOTIFY = {**settings.NOTIFY, "ALLOW_PRIVATE": True}
    network.answers["hooks.test"] = ["127.0.0.1"]
    with Receiver() as receiver:
        port = receiver.server.server_address[1]
        sub = subscriptions.create(team=setup.team, name="named", channel=Channel.SLACK, events=[Kind.JOB_FAILED],
                                   url=f"http://bot:p%40ss@hooks.test:{port}/ok/x?channel=ops")
        delivery = attempted(sub, setup)
    assert delivery.status == DeliveryStatus.SENT, delivery.last_error
    [request] = receiver.received
    assert request.path == "/ok/x?channel=ops" and request.headers["Host"] == f"hooks.test:{port}"
    assert request.headers["Authorization"] == "Basic Ym90OnBAc3M="  # bot:p@ss


def test_https_to_the_checked_address_still_names_and_verifies_the_host(setup, network, settings, tmp_path):
    settings.NOTIFY = {**settings.NOTIFY, "ALLOW_PRIVATE": True}
    network.answers["hooks.test"] = ["127.0.0.1"]
    with TLSListener(tmp_path) as listener:
        sub = subscriptions.create(team=setup.team, name="tls", channel=Channel.WEBHOOK,
                                   url=f"https://hooks.test:{listener.port}/hook", events=[Kind.JOB_FAILED])
        delivery = attempted(sub, setup)
    assert listener.server_names == ["hooks.test"]  # SNI: the host's name, not the address
    assert delivery.last_error == "TLS error: certificate verify failed"  # ours is self-signed: refused


def test_a_viewer_reads_what_failed_but_never_a_slack_urls_secret_path(setup, settings):
    settings.NOTIFY = {**settings.NOTIFY, "ALLOW_PRIVATE": True}
    with socket.socket() as closed:  # a port nobody listens on: the connection is refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    sub = subscriptions.create(team=setup.team, name="slack", channel=Channel.SLACK, events=[Kind.JOB_FAILED],
                               url=f"http://127.0.0.1:{port}/services/T0001/B0002/s3cr3tPATHtoken")
    delivery = attempted(sub, setup)
    assert delivery.last_error == "connection refused"
    viewer = client_for(setup.people["viewer"])
    seen = viewer.get("/api/v1/subscriptions/").content + viewer.get("/api/v1/deliveries/").content
    assert b"connection refused" in seen and b"s3cr3tPATHtoken" not in seen and b"services/T0001" not in seen


class TLSListener:
    """A TLS server on 127.0.0.1 with a self-signed certificate, remembering the server
    name (SNI) each handshake asked for."""

    def __init__(self, tmp_path: Path):
        self.context = _self_signed_context(tmp_path)
        self.server_names: list[str | None] = []
        self.context.sni_callback = lambda sock, name, context: self.server_names.append(name)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self):
        conn, _ = self.sock.accept()
        with conn:
            try:
                self.context.wrap_socket(conn, server_side=True).close()
            except (ssl.SSLError, OSError):
                pass  # the client refused our certificate

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.thread.join(10)
        self.sock.close()
