"""The web process stops for longer than the heartbeat timeout while a job
trains: agents cannot reach the API, so their silence says nothing (DESIGN §4).
No instance is marked lost, the agent's offline journal replays every report
exactly once when the API is back, and the job finishes with the right weights."""

from datetime import timedelta

import pytest
from django.utils import timezone

from respawn_server.jobs.core.choices import EndReason, JobStatus
from respawn_server.jobs.models import Checkpoint, Instance, InterruptionEvent
from tests.chaos import stack
from tests.conftest import WebServer, start_worker_and_beat, wait_until

HEARTBEAT_TIMEOUT = timedelta(seconds=float(stack.STACK_ENV["RESPAWN_HEARTBEAT_TIMEOUT_S"]))


@pytest.mark.e2e
def test_web_down_past_the_heartbeat_timeout_loses_no_report_and_no_instance(
        stack_env, chaos_web, tmp_path, uninterrupted_digest):
    job = stack.create_job(tmp_path / "ckpt", step_delay_s=0.1)  # long enough to outlast the outage
    worker, beat = start_worker_and_beat(stack_env, tmp_path)
    web = chaos_web
    try:
        instance = stack.wait_running(job, worker)
        wait_until(lambda: Checkpoint.objects.filter(instance=instance).exists(), timeout=120,
                   what="a first committed checkpoint", proc=worker)
        web.stop()
        deadline = Instance.objects.get(pk=instance.pk).heartbeat_deadline
        # Down until a full heartbeat timeout past the instance's deadline, seen by the reconciler.
        wait_until(lambda: timezone.now() > deadline + HEARTBEAT_TIMEOUT, timeout=120,
                   what="a heartbeat timeout past the deadline during the outage", proc=worker)
        wait_until(lambda: worker.output().count("is not serving") >= 3, timeout=60,
                   what="the reconciler to see the API down", proc=worker)
        web = WebServer(chaos_web.env, tmp_path / "web-again.log", port=chaos_web.port).start()
        job = stack.wait_finished(job, worker)
    finally:
        beat.stop()
        worker.stop()
        web.stop()
    assert job.status == JobStatus.SUCCEEDED, (job.status, job.status_reason, job.failure_message)
    assert job.artifact_digest == uninterrupted_digest
    instance.refresh_from_db()
    assert list(Instance.objects.filter(job=job).values_list("pk", "end_reason")) == \
        [(instance.pk, EndReason.COMPLETED)]
    assert not InterruptionEvent.objects.filter(instance__job=job).exists()
    stack.assert_every_report_applied_once(stack_env, instance)
    stack.assert_one_vm_per_instance_and_none_left(stack_env, job)
