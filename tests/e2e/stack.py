"""A job run on the whole stack to its end: the Celery worker and beat of tests.conftest
started for it, waited on until the job is terminal, stopped whatever happens."""

import contextlib
import hashlib
import os
import signal
import subprocess
from datetime import datetime
from pathlib import Path

from django.utils import timezone

from respawn_server.jobs.core.choices import InstanceState, JobStatus
from respawn_server.jobs.fleet.providers.local import LocalConfig, LocalProvider
from respawn_server.jobs.models import Instance, Job
from tests.conftest import FAST_LIVENESS, ROOT, free_port, start_worker_and_beat, wait_until
from tests.factories import make_job, make_team_with_members
from tests.history import job_story


def running_with_a_commit(job: Job) -> bool:
    """The job runs and its trainer has committed a checkpoint, seen on disk where the
    trainer writes it: the control plane hears of the commit later, by seconds on a loaded
    machine, while the trainer trains on (a notice sent on that word may find it done)."""
    return (Path(job.storage_uri) / "LATEST").exists() and Job.objects.get(pk=job.pk).status == JobStatus.RUNNING


def uninterrupted_digest(train: list[str], steps: int, directory: Path) -> str:
    """The exported weights of the tiny example's `train` (its last two arguments the step
    delay, dropped: the same weights, sooner) run to its end, never interrupted."""
    uri = directory / "reference"
    subprocess.run([*train[:-2], "--uri", str(uri)], cwd=ROOT, check=True, capture_output=True, timeout=300)
    exported = uri / "export" / f"step-{steps:08d}" / "model.safetensors"
    return "sha256:" + hashlib.sha256(exported.read_bytes()).hexdigest()


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


# A run on the local market's VMs, with notices every few seconds, on a loaded machine.
MARKET_LIVENESS = {**FAST_LIVENESS, "RESPAWN_HEARTBEAT_TIMEOUT_S": "5", "RESPAWN_RECONCILE_INTERVAL_S": "1"}
# The elastic modules' `liveness` (tests/conftest.py): three nodes a test on a loaded machine.
GANG_LIVENESS = {**FAST_LIVENESS, "RESPAWN_HEARTBEAT_TIMEOUT_S": "3", "RESPAWN_RECONCILE_INTERVAL_S": "0.5"}


@contextlib.contextmanager
def elastic_gang_stack(child_env: dict, web_url: str, tmp_path, command: list[str], total_steps: int, *,
                       grow_retry_s: float, **fields):
    """A 3-node elastic job (nodes_min 2) on local VMs, as `local_gang_stack`; a gang below
    its size tries to grow back after `grow_retry_s`."""
    env = {**child_env, "RESPAWN_API_URL": web_url, "RESPAWN_LOCAL_MARKET": "none",
           "RESPAWN_GROW_RETRY_S": str(grow_retry_s)}
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, nodes=3, nodes_min=2, command=command,
                   total_steps=total_steps, checkpoint_uri=str(tmp_path / "ckpt"), allowed_clouds=["local"],
                   instance_types=["cpu-small"], **fields)
    with local_gang_stack(job, env, tmp_path) as running:
        yield running


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


def kill_a_gangs_node(job: Job, vms: LocalProvider, worker, victim_rank: int) -> tuple[list[Instance], datetime, str]:
    """SIGKILL every process of the running gang's node `victim_rank` (a VM lost without a
    notice), then wait for the job to end: the gang's instances as they were, when the kill
    came, and the job's story (the job refreshed and succeeded, or the test fails with it)."""
    first = list(Instance.objects.filter(job=job, state=InstanceState.RUNNING).order_by("rank"))
    assert [i.rank for i in first] == list(range(job.nodes))
    killed_at = timezone.now()
    for pid in vms.processes(first[victim_rank].provider_instance_id):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_until(lambda: Job.objects.get(pk=job.pk).status in JobStatus.TERMINAL, timeout=300,
               what="the job to finish", proc=worker, interval=0.5, explain=lambda: job_story(job.pk, vms))
    job.refresh_from_db()
    story = job_story(job.pk, vms)
    assert job.status == JobStatus.SUCCEEDED, story
    return first, killed_at, story


def run_ranks_by_hand(train: list[str], uri: Path, world: int, steps: int) -> None:
    """`train` (a gang's command, `--steps` in it) to `steps` on `world` local ranks, by hand."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPAWN_")}
    env.update(WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    argv = [*train, "--uri", str(uri)]
    argv[argv.index("--steps") + 1] = str(steps)
    ranks = [subprocess.Popen(argv, cwd=ROOT, env={**env, "RANK": str(rank)}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE) for rank in range(world)]
    for proc in ranks:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
