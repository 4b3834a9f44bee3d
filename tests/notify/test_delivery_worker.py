"""Deliveries sent by a real Celery worker to a real HTTP server on 127.0.0.1: a job
failing through the agent API reaches each subscription once, signed; an endpoint
answering 5xx or too slowly is retried with back-off, then marked failing with the
reason, while a healthy one is delivered regardless."""

from __future__ import annotations

import pytest
from django.db import transaction

from respawn import protocol
from respawn_server.jobs.core.choices import Channel, DeliveryStatus, JobStatus
from respawn_server.jobs.core.choices import NotificationKind as Kind
from respawn_server.jobs.core.transitions import transition_job
from respawn_server.jobs.models import Delivery, Subscription
from respawn_server.jobs.notify import subscriptions
from tests.agent_api.helpers import AgentClient
from tests.api.clients import client_for
from tests.conftest import celery_worker, share_secrets_key, wait_until
from tests.factories import make_instance, make_job, make_team_with_members
from tests.notify.receiver import Receiver


@pytest.fixture
def worker_env(child_env, settings):
    """The worker signs with the secrets this test sealed: one key for both."""
    settings.NOTIFY = {**settings.NOTIFY, "ALLOW_PRIVATE": True}
    return share_secrets_key({**child_env, "RESPAWN_NOTIFY_ALLOW_PRIVATE": "1", "RESPAWN_NOTIFY_MAX_RETRIES": "2",
                              "RESPAWN_NOTIFY_BACKOFF_S": "1", "RESPAWN_NOTIFY_TIMEOUT_S": "0.5"}, settings)


@pytest.fixture
def worker(worker_env, tmp_path):
    process = celery_worker(worker_env, tmp_path / "worker.log").start()
    yield process
    process.stop()


def deliveries_explained() -> str:
    return "\n".join(f"{d.subscription.name}: {d.status} after {d.attempts}: {d.last_error}"
                     for d in Delivery.objects.select_related("subscription"))


def test_a_job_failing_through_the_agent_api_reaches_each_subscription_once_signed(worker):
    setup = make_team_with_members()
    with Receiver() as receiver:
        admin = client_for(setup.people["admin"])
        hook = admin.post("/api/v1/subscriptions/", {
            "team": setup.team.pk, "scope": "team", "name": "hook", "channel": Channel.WEBHOOK,
            "url": receiver.url("/ok/hook"), "events": [Kind.JOB_FAILED]}, format="json").json()
        receiver.secrets["/ok/hook"] = hook["secret"]
        slack = admin.post("/api/v1/subscriptions/", {
            "team": setup.team.pk, "scope": "team", "name": "slack", "channel": Channel.SLACK,
            "url": receiver.url("/ok/slack"), "events": [Kind.JOB_FAILED]}, format="json")
        assert slack.status_code == 201 and slack.json()["secret"] is None
        job = make_job(setup.team, setup.people["member"].user, status=JobStatus.PROVISIONING, max_restarts=0)
        agent = AgentClient()
        assert agent.register(make_instance(job).bootstrap_token).status_code == 200
        report = protocol.ExitReport(reason="failed", exit_code=1, last_exception="RuntimeError: CUDA out of memory",
                                     output_tail="epoch 3\nRuntimeError: CUDA out of memory")
        assert agent.post("exit", report).status_code == 200
        assert agent.post("exit", report).status_code == 200  # the agent's resend
        wait_until(lambda: Delivery.objects.filter(status=DeliveryStatus.SENT).count() == 2, timeout=60,
                   what="both deliveries sent", proc=worker, explain=deliveries_explained)
        [webhook] = receiver.at("/ok/hook")
        assert webhook.signature_ok is True
        body = webhook.json()
        assert body["kind"] == Kind.JOB_FAILED and body["details"]["job"]["id"] == job.pk
        assert "CUDA out of memory" in body["details"]["log_tail"] and body["details"]["cause"] == "user_code"
        assert webhook.headers["X-Respawn-Delivery"] == str(body["delivery"])
        [slack_message] = receiver.at("/ok/slack")
        assert slack_message.json()["text"].startswith(f"*Job {job.name} (#{job.pk}) failed")
        assert Delivery.objects.count() == 2 and len(receiver.received) == 2


def test_failing_and_slow_endpoints_are_retried_then_marked_failing(worker):
    setup = make_team_with_members()
    with Receiver(slow_s=2.0) as receiver:
        for name in ("fail", "slow", "ok"):
            subscriptions.create(team=setup.team, name=name, channel=Channel.SLACK, url=receiver.url(f"/{name}/x"),
                                 events=[Kind.JOB_SUCCEEDED])
        job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING)
        with transaction.atomic():
            transition_job(job.pk, JobStatus.RUNNING, JobStatus.SUCCEEDED, message="training completed")
        wait_until(lambda: not Delivery.objects.filter(status=DeliveryStatus.PENDING).exists(), timeout=90,
                   what="every delivery settled", proc=worker, explain=deliveries_explained)
    by_name = {d.subscription.name: d for d in Delivery.objects.select_related("subscription")}
    assert by_name["ok"].status == DeliveryStatus.SENT and by_name["ok"].attempts == 1
    failed, slow = by_name["fail"], by_name["slow"]
    assert failed.status == slow.status == DeliveryStatus.FAILED
    assert [a.status_code for a in failed.attempt_log.all()] == [500, 500, 500]  # the first try and 2 retries
    assert [a.error for a in slow.attempt_log.all()] == ["no answer within 0.5 s"] * 3
    assert len(receiver.at("/fail/x")) == 3
    reasons = {s.name: s.failing_reason for s in Subscription.objects.all()}
    assert "HTTP 500 (3 attempts)" in reasons["fail"]  # an answer from loopback is not kept
    assert "no answer within 0.5 s (3 attempts)" in reasons["slow"] and reasons["ok"] == ""
