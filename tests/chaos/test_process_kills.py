"""SIGKILL of the trainer in the middle of writing a checkpoint, then of the
agent of its replacement, then of the Celery worker in the middle of the
reconcile that finds that agent silent: the torn checkpoint is never loaded, each
replacement resumes from a committed one, and the job ends with bitwise the
weights of an uninterrupted run."""

import os
import re
import signal
import time
from pathlib import Path

import pytest
from django.utils import timezone

from respawn_server.jobs.core.choices import EndReason, JobStatus
from respawn_server.jobs.models import Checkpoint, Instance
from tests.chaos import stack
from tests.conftest import celery_worker, start_worker_and_beat, wait_until


def kill_mid_persist(pid: int, storage: Path, timeout: float = 90.0) -> str:
    """SIGKILL `pid` while a checkpoint directory has data but no manifest yet; returns its name."""
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        for step_dir in storage.glob("step-*"):
            if not (step_dir / "MANIFEST.json").exists() and any(step_dir.glob("data-*")):
                os.kill(pid, signal.SIGKILL)
                return step_dir.name
        time.sleep(0.002)
    raise AssertionError(f"no persist in progress under {storage} within {timeout}s")


def reconciles_received(worker) -> int:
    return len(re.findall(r"jobs\.tasks\.reconcile\[[^\]]+\] received", worker.output()))


def died(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


@pytest.mark.e2e
def test_killed_trainer_mid_persist_agent_and_worker_mid_reconcile_end_with_the_uninterrupted_weights(
        stack_env, tmp_path, uninterrupted_digest):
    job = stack.create_job(tmp_path / "ckpt")
    storage = tmp_path / "ckpt" / f"job-{job.pk}"
    worker, beat = start_worker_and_beat(stack_env, tmp_path)
    try:
        first = stack.wait_running(job, worker)
        wait_until(lambda: Checkpoint.objects.filter(instance=first).exists(), timeout=120,
                   what="a first committed checkpoint", proc=worker)
        trainer = stack.process_of(stack_env, first, "respawn.examples.tiny")
        torn = kill_mid_persist(trainer, storage)
        wait_until(lambda: died(trainer), timeout=10, what="the killed trainer to be gone")
        assert not (storage / torn / "MANIFEST.json").exists(), f"{torn} was committed before the kill landed"

        second = stack.wait_running(job, worker, after={first.pk})
        resumed_at = second.resume_checkpoint.step
        wait_until(lambda: Instance.objects.get(pk=second.pk).last_step >= resumed_at + 20, timeout=120,
                   what="the replacement to train past its resume step", proc=worker)
        os.kill(stack.process_of(stack_env, second, "respawn.agent"), signal.SIGKILL)
        # The worker is SIGKILLed as it takes the first reconcile that finds the instance silent (dying inside it).
        deadline = Instance.objects.get(pk=second.pk).heartbeat_deadline
        wait_until(lambda: timezone.now() > deadline, timeout=60, what="the silent instance's deadline", proc=worker)
        reconciles = reconciles_received(worker)
        wait_until(lambda: reconciles_received(worker) > reconciles, timeout=60, what="a reconcile", proc=worker,
                   interval=0.01)
        worker.stop(signal.SIGKILL)
        worker = celery_worker(stack_env, tmp_path / "worker-again.log").start()

        third = stack.wait_running(job, worker, after={first.pk, second.pk})
        job = stack.wait_finished(job, worker)
    finally:
        beat.stop()
        worker.stop()
    assert job.status == JobStatus.SUCCEEDED, (job.status, job.status_reason, job.failure_message)
    assert job.artifact_digest == uninterrupted_digest
    ends = {i.pk: i.end_reason for i in Instance.objects.filter(job=job)}
    assert ends == {first.pk: EndReason.FAILED, second.pk: EndReason.PREEMPTED, third.pk: EndReason.COMPLETED}
    assert job.failure_restarts == 1 and job.preemptions == 1
    # The torn directory was never reported, so never offered to a replacement; each resumed from a committed one.
    assert not Checkpoint.objects.filter(instance=first, step=int(torn.split("-")[1])).exists()
    for later in (second, third):
        later.refresh_from_db()
        assert later.resume_checkpoint is not None and later.resume_checkpoint.step > 0
    assert third.resume_checkpoint.step >= second.resume_checkpoint.step
    stack.assert_one_vm_per_instance_and_none_left(stack_env, job)
