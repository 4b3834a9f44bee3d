"""The broker is only a nudge; the database is the truth (DESIGN §1). A Celery
worker SIGKILLed in the middle of launching a VM, and the test's own Redis
restarted empty with messages queued: no duplicate VM, no orphan, the job
finishes with the uninterrupted weights."""

import json
import os
import signal

import pytest

from respawn_server.jobs.core.choices import EndReason, InstanceState, JobStatus
from respawn_server.jobs.models import Checkpoint, Instance, Job
from tests.chaos import stack
from tests.conftest import celery_worker, start_worker_and_beat, wait_until


@pytest.fixture
def redis_server(tmp_path):
    server = stack.RedisServer(tmp_path / "redis.log").start()
    yield server
    server.stop(signal.SIGKILL)


@pytest.fixture
def broker_url(redis_server):
    return redis_server.url


@pytest.fixture
def env(stack_env):
    # A killed worker's unacked task comes back within the test, so its redelivery is exercised too.
    return {**stack_env, "RESPAWN_VISIBILITY_TIMEOUT_S": "10"}


def ends_of(job):
    return dict(Instance.objects.filter(job=job).values_list("pk", "end_reason"))


def launching_instance(env) -> int | None:
    """The instance whose VM the provider is writing (its spec is there), if any."""
    for instance_id, names in stack.vm_dirs_by_instance(env).items():
        if any((stack.provider(env).vm_dir(name).spec_file).exists() for name in names):
            return instance_id
    return None


def message_ids(client, key: str) -> set[str]:
    """The ids of the Celery messages waiting in a Redis list."""
    return {json.loads(raw)["headers"]["id"] for raw in client.lrange(key, 0, -1)}


@pytest.mark.e2e
def test_worker_killed_mid_launch_makes_no_duplicate_and_no_orphan_vm(env, tmp_path, uninterrupted_digest):
    job = stack.create_job(tmp_path / "ckpt")
    worker, beat = start_worker_and_beat(env, tmp_path)
    try:
        wait_until(lambda: launching_instance(env), timeout=120, what="a VM being launched", proc=worker,
                   interval=0.005)
        worker.stop(signal.SIGKILL)
        instance_id = launching_instance(env)
        assert Instance.objects.get(pk=instance_id).state == InstanceState.REQUESTED  # the database has no VM id yet
        worker = celery_worker(env, tmp_path / "worker-again.log").start()
        job = stack.wait_finished(job, worker)
    finally:
        beat.stop()
        worker.stop()
    assert job.status == JobStatus.SUCCEEDED, (job.status, job.status_reason, job.failure_message)
    assert job.artifact_digest == uninterrupted_digest
    # Either the half-launched VM registered and trained (it is adopted), or it never came up and its
    # instance was replaced after the provisioning timeout; nothing else.
    ends = ends_of(job)
    completed = [pk for pk, end in ends.items() if end == EndReason.COMPLETED]
    assert len(completed) == 1 and set(ends.values()) <= {EndReason.COMPLETED, EndReason.CAPACITY_ERROR}, ends
    assert instance_id in completed or ends[instance_id] == EndReason.CAPACITY_ERROR
    stack.assert_one_vm_per_instance_and_none_left(env, job)


@pytest.mark.e2e
def test_redis_restarted_empty_loses_queued_messages_and_the_database_makes_up_for_them(
        env, redis_server, tmp_path, uninterrupted_digest):
    job = stack.create_job(tmp_path / "ckpt")
    worker, beat = start_worker_and_beat(env, tmp_path)
    try:
        first = stack.wait_running(job, worker)
        wait_until(lambda: Checkpoint.objects.filter(instance=first).exists(), timeout=120,
                   what="a first committed checkpoint", proc=worker)
        worker.stop()  # messages now wait in Redis
        # The trainer dies: the web records the failure and queues "schedule a replacement".
        os.kill(stack.process_of(env, first, "respawn.examples.tiny"), signal.SIGKILL)
        wait_until(lambda: Job.objects.get(pk=job.pk).status == JobStatus.RECOVERING, timeout=60,
                   what="the job to wait for a replacement", proc=beat)
        queue, queue_key = redis_server.client(), os.environ["RESPAWN_BROKER_KEY_PREFIX"] + "celery"
        # The nudge is pushed right after the commit that made the job recovering: wait for it.
        wait_until(lambda: queue.llen(queue_key) > 0, timeout=30, what="a message waiting in Redis")
        queued = message_ids(queue, queue_key)
        redis_server.stop(signal.SIGKILL)
        redis_server = stack.RedisServer(tmp_path / "redis-again.log", port=redis_server.port).start()
        # Every queued message is gone (beat, still running, may already have sent a new one).
        assert queued and not queued & message_ids(redis_server.client(), queue_key)
        worker = celery_worker(env, tmp_path / "worker-again.log").start()
        job = stack.wait_finished(job, worker)
    finally:
        beat.stop()
        worker.stop()
        redis_server.stop(signal.SIGKILL)
    assert job.status == JobStatus.SUCCEEDED, (job.status, job.status_reason, job.failure_message)
    assert job.artifact_digest == uninterrupted_digest
    ends = ends_of(job)
    assert ends.pop(first.pk) == EndReason.FAILED and list(ends.values()) == [EndReason.COMPLETED]
    stack.assert_one_vm_per_instance_and_none_left(env, job)
