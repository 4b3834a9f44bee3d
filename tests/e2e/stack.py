"""A job run on the whole stack to its end: the Celery worker and beat of tests.conftest
started for it, waited on until the job is terminal, stopped whatever happens."""

import contextlib
from pathlib import Path

from respawn_server.jobs.core.choices import JobStatus
from respawn_server.jobs.fleet.providers.local import LocalConfig, LocalProvider
from respawn_server.jobs.models import Job
from tests.conftest import start_worker_and_beat, wait_until
from tests.history import job_story


def running_with_a_commit(job: Job) -> bool:
    """The job runs and its trainer has committed a checkpoint, seen on disk where the
    trainer writes it: the control plane hears of the commit later, by seconds on a loaded
    machine, while the trainer trains on (a notice sent on that word may find it done)."""
    return (Path(job.storage_uri) / "LATEST").exists() and Job.objects.get(pk=job.pk).status == JobStatus.RUNNING


def run_to_the_end(job: Job, env: dict, tmp_path, *, timeout: float = 800, meanwhile=None) -> Job:
    """`job` once it is terminal, refreshed; on a timeout the failure tells its story.
    `meanwhile(worker)`, if given, runs once the worker and beat have started (what a test
    does to the running job)."""
    worker, beat = start_worker_and_beat(env, tmp_path)
    try:
        if meanwhile is not None:
            meanwhile(worker)
        wait_until(lambda: Job.objects.get(pk=job.pk).status in JobStatus.TERMINAL, timeout=timeout,
                   what="the job to finish", proc=worker, interval=0.5, explain=lambda: job_story(job.pk))
    finally:
        beat.stop()
        worker.stop()
    job.refresh_from_db()
    return job


@contextlib.contextmanager
def local_gang_stack(job: Job, env: dict, tmp_path):
    """A Celery worker and beat started for a job on local VMs: yields (job, the VMs'
    provider, the worker); stops beat, then the worker, whatever happens."""
    worker, beat = start_worker_and_beat(env, tmp_path)
    try:
        yield job, LocalProvider(LocalConfig(root=str(tmp_path / "var" / "local-vms"))), worker
    finally:
        beat.stop()
        worker.stop()
