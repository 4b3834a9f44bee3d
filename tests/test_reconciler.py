"""The reconciler marks silent instances lost — but not while the control plane
itself was down — and runs for real under Celery beat and a worker on Redis."""

import os
import threading
from datetime import timedelta

import pytest
import redis
from django.utils import timezone

from respawn import protocol
from respawn_server.jobs.core.choices import EndReason, InstanceState, JobStatus
from respawn_server.jobs.models import Instance, InterruptionEvent, Job, ServiceBeat
from respawn_server.jobs.tasks import reconcile
from tests.agent_api.helpers import AgentClient
from tests.conftest import start_worker_and_beat, wait_until
from tests.factories import make_instance, make_job, make_team_with_members

REDIS_URL = os.environ.get("RESPAWN_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def running_instance(job, *, deadline_in_s: float):
    setup = make_instance(job, state=InstanceState.RUNNING, registered=True)
    Instance.objects.filter(pk=setup.instance.pk).update(
        heartbeat_deadline=timezone.now() + timedelta(seconds=deadline_in_s), last_step=120)
    return setup.instance


@pytest.fixture
def job(db):
    setup = make_team_with_members()
    return make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING)


@pytest.fixture
def fast(settings):
    settings.RECONCILE_INTERVAL_S = 0.2
    settings.RESPAWN = {**settings.RESPAWN, "HEARTBEAT_TIMEOUT_S": 0.5}
    return settings


def test_silent_instance_is_marked_lost_once_the_api_has_served_a_full_timeout(job, fast, web_server):
    fast.RESPAWN = {**fast.RESPAWN, "API_URL": web_server.url}
    silent = running_instance(job, deadline_in_s=-1)
    ServiceBeat.objects.update_or_create(name="agent_api", defaults={
        "last_seen": timezone.now(), "serving_since": timezone.now() - timedelta(seconds=5)})
    assert reconcile() == 1
    silent.refresh_from_db()
    assert silent.state == InstanceState.ENDED and silent.end_reason == EndReason.LOST
    event = InterruptionEvent.objects.get(instance=silent)
    assert event.source == "heartbeat_timeout" and event.kind == "lost" and event.steps_lost == 120
    # The same sweep places a replacement for the lost node.
    assert Job.objects.get(pk=job.pk).status == JobStatus.PROVISIONING
    assert Instance.objects.filter(job=job, state=InstanceState.REQUESTED).count() == 1
    assert reconcile() == 0  # safe to run twice


def test_a_silent_vm_saving_under_a_notice_is_not_fenced_before_the_notice_deadline(job, fast, web_server):
    """Under load a VM saving its notice checkpoint heartbeated late and was terminated
    mid-save (CI, Azure's 10 s notice): the save its spare waits for was killed with it."""
    fast.RESPAWN = {**fast.RESPAWN, "API_URL": web_server.url}
    ServiceBeat.objects.update_or_create(name="agent_api", defaults={
        "last_seen": timezone.now(), "serving_since": timezone.now() - timedelta(seconds=5)})
    saving = running_instance(job, deadline_in_s=-1)
    Instance.objects.filter(pk=saving.pk).update(state=InstanceState.PREEMPTING)
    notice_deadline = timezone.now() + timedelta(seconds=30)
    InterruptionEvent.objects.create(instance=saving, kind="notice", source="azure_scheduled_events",
                                     notice_time=timezone.now(), deadline=notice_deadline)
    reconcile()
    saving.refresh_from_db()
    assert saving.state == InstanceState.PREEMPTING and saving.heartbeat_deadline == notice_deadline
    assert reconcile() == 0  # not due again until the deadline
    # Past its deadline, still silent: it is judged as any silent instance is.
    Instance.objects.filter(pk=saving.pk).update(heartbeat_deadline=timezone.now() - timedelta(seconds=1))
    InterruptionEvent.objects.filter(instance=saving).update(deadline=timezone.now() - timedelta(seconds=1))
    assert reconcile() == 1
    saving.refresh_from_db()
    assert saving.state == InstanceState.ENDED and saving.end_reason == EndReason.LOST


def test_a_silent_vm_claiming_a_far_notice_deadline_is_spared_no_longer_than_a_clouds_longest_window(
        job, fast, web_server):
    """The deadline is the VM's word: one claiming a day is judged two minutes after its
    notice reached the control plane, as a cloud would have taken it by then."""
    fast.RESPAWN = {**fast.RESPAWN, "API_URL": web_server.url}
    ServiceBeat.objects.update_or_create(name="agent_api", defaults={
        "last_seen": timezone.now(), "serving_since": timezone.now() - timedelta(seconds=5)})
    silent = running_instance(job, deadline_in_s=-1)
    Instance.objects.filter(pk=silent.pk).update(state=InstanceState.PREEMPTING)
    notice = InterruptionEvent.objects.create(instance=silent, kind="notice", source="aws_imds",
                                              notice_time=timezone.now(), deadline=timezone.now() + timedelta(days=1))
    reconcile()
    silent.refresh_from_db()
    assert silent.heartbeat_deadline == notice.received_at + timedelta(minutes=2)
    InterruptionEvent.objects.filter(pk=notice.pk).update(received_at=timezone.now() - timedelta(minutes=3))
    Instance.objects.filter(pk=silent.pk).update(heartbeat_deadline=timezone.now() - timedelta(seconds=1))
    assert reconcile() == 1
    silent.refresh_from_db()
    assert silent.state == InstanceState.ENDED and silent.end_reason == EndReason.LOST


def test_no_instance_is_lost_while_the_api_is_unreachable(job, fast, db):
    fast.RESPAWN = {**fast.RESPAWN, "API_URL": "http://127.0.0.1:9"}  # nothing listens there
    silent = running_instance(job, deadline_in_s=-1)
    assert reconcile() == 0
    assert Instance.objects.get(pk=silent.pk).state == InstanceState.RUNNING


def test_no_instance_is_lost_right_after_the_api_came_back(job, fast, web_server):
    fast.RESPAWN = {**fast.RESPAWN, "API_URL": web_server.url, "HEARTBEAT_TIMEOUT_S": 3600}
    silent = running_instance(job, deadline_in_s=-1)
    ServiceBeat.objects.all().delete()  # as after an outage: serving starts now
    assert reconcile() == 0
    assert Instance.objects.get(pk=silent.pk).state == InstanceState.RUNNING


def test_concurrent_resends_of_one_report_apply_once(transactional_db):
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.PROVISIONING)
    client = AgentClient()
    client.register(make_instance(job).bootstrap_token)
    report = protocol.LogBatch(offset=0, lines=["once"])
    results = []

    def send():
        results.append(AgentClient(client.client._credentials["HTTP_AUTHORIZATION"].split()[1])
                       .post("logs", report).json()["duplicate"])

    threads = [threading.Thread(target=send) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False, True, True, True]


@pytest.mark.e2e
def test_beat_and_worker_on_redis_mark_a_silent_instance_lost(child_env, web_server, tmp_path, db):
    client = redis.Redis.from_url(REDIS_URL)
    client.ping()  # no Redis is a failure here, never a skip
    for key in client.scan_iter(os.environ["RESPAWN_BROKER_KEY_PREFIX"] + "*"):  # this run's keys only
        client.delete(key)
    env = {**child_env, "CELERY_BROKER_URL": REDIS_URL, "RESPAWN_API_URL": web_server.url}
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING)
    silent = running_instance(job, deadline_in_s=0.5)
    worker, beat = start_worker_and_beat(env, tmp_path, pool="solo", concurrency=None)
    try:
        wait_until(lambda: Instance.objects.get(pk=silent.pk).state == InstanceState.ENDED, timeout=60,
                   what="the reconciler to mark the silent instance lost", proc=worker)
    finally:
        beat.stop()
        worker.stop()
    assert Instance.objects.get(pk=silent.pk).end_reason == EndReason.LOST
    assert "respawn_server.jobs.tasks.reconcile" in worker.output() and "succeeded" in worker.output()


@pytest.mark.store
def test_each_test_run_sends_its_tasks_under_its_own_broker_keys():
    """Concurrent runs sharing a Redis (two checkouts, parallel sessions) never run each
    other's tasks: this run's queue lives under its own key prefix, as a deployment's
    can with RESPAWN_BROKER_KEY_PREFIX."""
    from respawn_server.celery import app

    client = redis.Redis.from_url(REDIS_URL)
    ours = os.environ["RESPAWN_BROKER_KEY_PREFIX"] + "celery"
    client.delete(ours)
    unprefixed = client.llen("celery")
    with app.connection_for_write(REDIS_URL) as connection:
        reconcile.apply_async(connection=connection)
    assert (client.llen(ours), client.llen("celery")) == (1, unprefixed)
    client.delete(ours)
