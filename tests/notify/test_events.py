"""Happenings become notification rows in their own transaction, once per subscription,
and a worker's attempt delivers them (here the task runs in this process, through
Celery's own apply: retries included)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core import mail
from django.utils import timezone

from respawn import protocol
from respawn_server.jobs.core.choices import Channel, DeliveryStatus, EndReason, InstanceState, JobStatus
from respawn_server.jobs.core.choices import NotificationKind as Kind
from respawn_server.jobs.core.transitions import transition_job
from respawn_server.jobs.fleet.scheduler import schedule
from respawn_server.jobs.models import Checkpoint, Delivery, Job, JobEvent, Notification, Subscription, Team
from respawn_server.jobs.money.budget import warn_over_budget
from respawn_server.jobs.notify import events, subscriptions
from respawn_server.jobs.reports.checkpoints import record_validation
from respawn_server.jobs.tasks import deliver_notification
from tests.agent_api.helpers import AgentClient, checkpoint_report
from tests.api.clients import client_for
from tests.factories import make_instance, make_job, make_team_with_members

pytestmark = pytest.mark.django_db


@pytest.fixture
def setup():
    return make_team_with_members()


def subscribe(team, kinds, *, user=None, channel=Channel.EMAIL, **fields):
    defaults = {"email": "ops@example.com"} if channel == Channel.EMAIL else {}
    return subscriptions.create(team=team, user=user, name=f"sub-{len(kinds)}-{channel}", events=list(kinds),
                                channel=channel, **{**defaults, **fields})


def running_agent(job):
    agent = AgentClient()
    assert agent.register(make_instance(job).bootstrap_token).status_code == 200
    return agent


def test_it_records_one_delivery_per_subscription_when_a_job_fails_even_when_the_exit_is_sent_twice(setup):
    team_sub = subscribe(setup.team, [Kind.JOB_FAILED])
    mine = subscribe(setup.team, [Kind.JOB_FAILED, Kind.JOB_SUCCEEDED], user=setup.people["member"].user)
    subscribe(setup.team, [Kind.JOB_SUCCEEDED])  # not for failures
    subscribe(setup.team, [Kind.JOB_FAILED], user=setup.people["admin"].user)  # not this person's job
    subscribe(setup.other_team, [Kind.JOB_FAILED])  # another team's
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.PROVISIONING, max_restarts=0)
    agent = running_agent(job)
    exit_report = protocol.ExitReport(reason="failed", exit_code=1, last_exception="ValueError: bad batch",
                                      output_tail="step 10\nTraceback (most recent call last):\nValueError: bad batch")
    assert agent.post("exit", exit_report).status_code == 200
    assert agent.post("exit", exit_report).status_code == 200  # the agent's resend, same event id
    again = protocol.ExitReport(**{**protocol.to_dict(exit_report), "event_id": None})
    agent.post("exit", again)  # and a report of the same exit under a new id
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    notification = Notification.objects.get()
    assert notification.kind == Kind.JOB_FAILED and notification.job_id == job.pk
    assert sorted(Delivery.objects.values_list("subscription_id", flat=True)) == sorted([team_sub.pk, mine.pk])
    assert "The training code failed" in notification.title
    assert "ValueError: bad batch" in notification.text and "Traceback" in notification.details["log_tail"]


def test_it_writes_nothing_when_nobody_subscribed(setup):
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING)
    transition_job(job.pk, JobStatus.RUNNING, JobStatus.SUCCEEDED, message="training completed")
    assert not Notification.objects.exists() and not Delivery.objects.exists()


def test_it_emails_through_djangos_backend(setup):
    sub = subscribe(setup.team, [Kind.JOB_SUCCEEDED], email="team@example.com")
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING, last_step=1000)
    transition_job(job.pk, JobStatus.RUNNING, JobStatus.SUCCEEDED, message="training completed")
    delivery = Delivery.objects.get(subscription=sub)
    deliver_notification.apply(args=[delivery.pk])
    assert [m.to for m in mail.outbox] == [["team@example.com"]]
    assert "succeeded" in mail.outbox[0].subject and "step 1000" in mail.outbox[0].body
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.SENT and delivery.attempt_log.get().ok
    deliver_notification.apply(args=[delivery.pk])  # a message delivered twice by the broker
    assert len(mail.outbox) == 1


def test_a_name_with_line_breaks_adds_no_header_to_an_email(setup):
    # A member names the job (the API keeps a line break inside a name); the name reaches
    # the subject. Django refused the whole message (BadHeaderError), failing the delivery.
    submitted = client_for(setup.people["member"]).post("/api/v1/jobs/", {
        "team": setup.team.pk, "name": "resnet\r\nBcc: victim@example.com\nX-Evil: 1", "command": ["python", "t.py"]},
        format="json")
    assert submitted.status_code == 201, submitted.content
    sub = subscribe(setup.team, [Kind.JOB_SUCCEEDED], email="team@example.com")
    job = Job.objects.get(pk=submitted.json()["id"])
    Job.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING)
    transition_job(job.pk, JobStatus.RUNNING, JobStatus.SUCCEEDED, message="training completed")
    delivery = Delivery.objects.get(subscription=sub)
    deliver_notification.apply(args=[delivery.pk])
    [message] = mail.outbox
    assert message.recipients() == ["team@example.com"] and message.bcc == []
    headers = message.message()
    assert headers["Subject"] == f"Job resnet Bcc: victim@example.com X-Evil: 1 (#{job.pk}) succeeded"
    assert headers["Bcc"] is None and headers["X-Evil"] is None
    assert Delivery.objects.get(pk=delivery.pk).status == DeliveryStatus.SENT


def test_it_tells_of_a_burst_when_the_nth_preemption_within_an_hour_comes(setup):
    sub = subscribe(setup.team, [Kind.PREEMPTION_BURST], preemption_burst=2)
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING)
    for n in range(3):
        make_instance(job, state=InstanceState.ENDED, end_reason=EndReason.PREEMPTED,
                                 ended_at=timezone.now())
        transition_job(job.pk, JobStatus.RUNNING, JobStatus.RECOVERING, message="instance preempted",
                       preemptions=n + 1)
        job.status = JobStatus.RUNNING
        job.save(update_fields=["status"])
        told = Delivery.objects.filter(subscription=sub).count()
        assert told == (0 if n == 0 else 1), f"after preemption {n + 1}"
    burst = Notification.objects.get()
    assert "2 preemptions" in burst.title and burst.details["preemptions_last_hour"] == 2


def test_it_tells_of_a_checkpoint_that_failed_validation(setup):
    sub = subscribe(setup.team, [Kind.CHECKPOINT_INVALID])
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.PROVISIONING,
                   validation_model_factory="m:model", validation_batch_factory="m:batch")
    agent = running_agent(job)
    report = checkpoint_report(job, 30)
    agent.post("checkpoints", report)
    checkpoint = Checkpoint.objects.get()
    record_validation(checkpoint, result="invalid", loss=9.0, message="loss 9.0 vs reference 1.0")
    record_validation(checkpoint, result="invalid", loss=9.0, message="loss 9.0 vs reference 1.0")
    delivery = Delivery.objects.get(subscription=sub)
    assert "step 30 failed validation" in delivery.notification.title
    assert delivery.notification.details["checkpoint"]["message"] == "loss 9.0 vs reference 1.0"


def test_it_tells_every_member_subscribed_of_a_budget_warning(setup):
    team_sub = subscribe(setup.team, [Kind.BUDGET_WARNING])
    viewer_sub = subscribe(setup.team, [Kind.BUDGET_WARNING], user=setup.people["viewer"].user)
    Team.objects.filter(pk=setup.team.pk).update(monthly_budget_usd=0)
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING)
    make_instance(job, state=InstanceState.RUNNING, price_per_hour_at_launch=5,
                  running_at=timezone.now() - timedelta(hours=2))
    setup.team.refresh_from_db()
    assert warn_over_budget(setup.team)
    setup.team.refresh_from_db()
    assert warn_over_budget(setup.team)  # still over: no new warning, nothing told again
    assert set(Delivery.objects.values_list("subscription_id", flat=True)) == {team_sub.pk, viewer_sub.pk}


def test_the_sweep_tells_of_a_job_recovering_past_each_subscriptions_threshold_once(setup):
    soon = subscribe(setup.team, [Kind.RECOVERING_LONG], recovering_after_s=600)
    later = subscribe(setup.team, [Kind.RECOVERING_LONG], recovering_after_s=3600)
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING)
    transition_job(job.pk, JobStatus.RUNNING, JobStatus.RECOVERING, message="instance lost", preemptions=1)
    entered = JobEvent.objects.get(to_status=JobStatus.RECOVERING).created_at
    assert events.sweep(entered + timedelta(seconds=599)) == 0
    events.sweep(entered + timedelta(seconds=601))
    events.sweep(entered + timedelta(seconds=900))
    assert list(Delivery.objects.values_list("subscription_id", flat=True)) == [soon.pk]
    events.sweep(entered + timedelta(seconds=3601))
    assert Notification.objects.count() == 1
    assert sorted(Delivery.objects.values_list("subscription_id", flat=True)) == sorted([soon.pk, later.pk])


def test_the_sweep_tells_of_a_deadline_even_on_demand_would_miss(setup):
    sub = subscribe(setup.team, [Kind.DEADLINE_AT_RISK])
    now = timezone.now()
    make_job(setup.team, setup.people["member"].user, status=JobStatus.QUEUED, total_steps=1000,
             deadline=now + timedelta(days=30))  # plenty of time
    late = make_job(setup.team, setup.people["member"].user, status=JobStatus.QUEUED, total_steps=1000,
                    deadline=now + timedelta(minutes=1))
    events.sweep(now)
    events.sweep(now)
    delivery = Delivery.objects.get(subscription=sub)
    assert delivery.notification.job_id == late.pk and delivery.notification.details["slack_s"] < 0


def test_a_disabled_subscription_or_one_of_a_person_who_left_is_told_nothing(setup):
    subscribe(setup.team, [Kind.JOB_SUCCEEDED], enabled=False)
    owner = setup.people["member"].user
    subscribe(setup.team, [Kind.JOB_SUCCEEDED], user=owner)
    owner.memberships.all().delete()
    job = make_job(setup.team, owner, status=JobStatus.RUNNING)
    transition_job(job.pk, JobStatus.RUNNING, JobStatus.SUCCEEDED, message="training completed")
    assert not Delivery.objects.exists()
    assert Subscription.objects.count() == 2


def test_a_launch_held_by_the_budget_is_told_once_per_hold(setup, settings):
    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": ["local"]}
    sub = subscribe(setup.team, [Kind.LAUNCH_HELD], user=setup.people["member"].user)
    Team.objects.filter(pk=setup.team.pk).update(monthly_budget_usd=Decimal("0.10"))
    job = make_job(setup.team, setup.people["member"].user, allowed_clouds=["local"])
    schedule()
    schedule()  # still held: the same hold
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED
    delivery = Delivery.objects.get(subscription=sub)
    assert "monthly budget" in delivery.notification.text and delivery.notification.job_id == job.pk
