"""The whole system as real processes, for breaking on purpose: a job training
the tiny model on the local provider (no simulated spot market: the faults are
the test's own), a Celery worker and beat, and ways to find and kill the parts."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import redis

from respawn_server.jobs.core.choices import InstanceState, JobStatus
from respawn_server.jobs.fleet.providers.local import LocalConfig, LocalProvider
from respawn_server.jobs.models import Instance, Job, LogChunk, MetricPoint, ProcessedEvent
from tests.conftest import ROOT, ChildProcess, free_port, wait_until
from tests.factories import make_job, make_team_with_members

STEPS, STEP_DELAY_S = 240, 0.03
# Checkpoints of a few MiB, so a persist takes long enough to be killed in the middle of.
TINY_HIDDEN = "1024"
TRAIN = [sys.executable, "-m", "respawn.examples.tiny", "--steps", str(STEPS), "--step-delay", str(STEP_DELAY_S)]
# Seconds; generous because the box is shared: the outcome is awaited, never the clock asserted.
JOB_TIMEOUT_S = 240
STACK_ENV = {
    "RESPAWN_LOCAL_MARKET": "none",
    "RESPAWN_HEARTBEAT_INTERVAL_S": "0.5",
    "RESPAWN_HEARTBEAT_TIMEOUT_S": "5",
    "RESPAWN_RECONCILE_INTERVAL_S": "1",
    "RESPAWN_PROVISION_TIMEOUT_S": "60",
    "TINY_HIDDEN": TINY_HIDDEN,
    # Agents back off at most a small part of the heartbeat timeout, as in production (30 s of 120 s).
    "RESPAWN_BACKOFF_MAX_S": "1",
}


def reference_digest(directory: Path) -> str:
    """The exported weights of the same training, never interrupted."""
    uri = directory / "reference"
    env = {**os.environ, "TINY_HIDDEN": TINY_HIDDEN}
    subprocess.run([*TRAIN[:-2], "--uri", str(uri)], cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
    return file_digest(uri / "export" / f"step-{STEPS:08d}" / "model.safetensors")


def file_digest(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def create_job(checkpoint_uri: Path, *, step_delay_s: float = STEP_DELAY_S, **fields) -> Job:
    """The tiny training as a job; a longer `step_delay_s` makes it last (same weights)."""
    setup = make_team_with_members()
    command = [*TRAIN[:-1], str(step_delay_s)]
    return make_job(setup.team, setup.people["member"].user, command=command, total_steps=STEPS,
                    checkpoint_uri=str(checkpoint_uri), checkpoint_interval_s=1.0, allowed_clouds=["local"],
                    instance_types=["cpu-small"], env={"TINY_HIDDEN": TINY_HIDDEN},
                    validation_model_factory="respawn.examples.tiny:make_model",
                    validation_batch_factory="respawn.examples.tiny:validation_batch", **fields)


def provider(env: dict) -> LocalProvider:
    return LocalProvider(LocalConfig(root=str(Path(env["RESPAWN_VAR_DIR"]) / "local-vms")))


def vm_dirs_by_instance(env: dict) -> dict[int, list[str]]:
    """Every VM directory ever made, by the instance id it was launched for."""
    root = Path(env["RESPAWN_VAR_DIR"]) / "local-vms"
    found: dict[int, list[str]] = {}
    for entry in sorted(root.glob("local-*-*")) if root.exists() else []:
        found.setdefault(int(entry.name.split("-")[1]), []).append(entry.name)
    return found


def running_instance(job: Job, *, after: set[int] = frozenset()) -> Instance | None:
    """The job's running instance (not one of `after`) once it has trained a step."""
    return (Instance.objects.filter(job=job, state=InstanceState.RUNNING, last_step__gte=1)
            .exclude(pk__in=after).exclude(provider_instance_id="").first())


def wait_running(job: Job, proc: ChildProcess, *, after: set[int] = frozenset()) -> Instance:
    wait_until(lambda: running_instance(job, after=after) is not None, timeout=JOB_TIMEOUT_S,
               what="an instance of the job training", proc=proc, interval=0.2)
    return running_instance(job, after=after)


def process_of(env: dict, instance: Instance, module: str) -> int:
    """Pid of the VM's process running `python -m <module>` (the agent: "respawn.agent", the trainer: its module)."""
    for pid in provider(env).processes(instance.provider_instance_id):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"-m" in argv and argv[argv.index(b"-m") + 1].decode() == module:
            return pid
    raise AssertionError(f"no `python -m {module}` among the processes of VM {instance.provider_instance_id}")


def wait_finished(job: Job, proc: ChildProcess) -> Job:
    wait_until(lambda: Job.objects.get(pk=job.pk).status in JobStatus.TERMINAL, timeout=JOB_TIMEOUT_S,
               what="the job to finish", proc=proc, interval=0.5)
    job.refresh_from_db()
    return job


def assert_one_vm_per_instance_and_none_left(env: dict, job: Job) -> None:
    """No duplicate VM (one directory per instance id) and no orphan once the job has ended."""
    dirs = vm_dirs_by_instance(env)
    assert all(len(names) == 1 for names in dirs.values()), dirs
    known = set(Instance.objects.filter(job=job).values_list("pk", flat=True))
    assert set(dirs) <= known, (dirs, known)
    cloud = provider(env)
    wait_until(lambda: not cloud.list_ours(), timeout=60, what="every VM of the finished job to be gone")


def journaled_reports(env: dict, vm_id: str) -> dict[str, str]:
    """event_id -> protocol path of every report the VM's agent journaled (DESIGN §1:
    each is appended before it is sent), read from its offline journal."""
    vm = provider(env).vm_dir(vm_id)
    reports = {}
    for line in (Path(vm.work_dir) / "journal" / "journal.log").read_bytes().splitlines():
        record = json.loads(line.split(b" ", 1)[1])
        reports[record["body"]["event_id"]] = record["path"]
    return reports


def assert_every_report_applied_once(env: dict, instance: Instance) -> None:
    applied = ProcessedEvent.objects.filter(instance_id=instance.pk).values_list("event_id", flat=True)
    assert_reports_applied_once(journaled_reports(env, instance.provider_instance_id), list(applied),
                                heartbeats_applied=MetricPoint.objects.filter(instance=instance).count(),
                                logs=list(LogChunk.objects.filter(instance=instance).values_list("offset", "lines")))


def assert_reports_applied_once(journaled: dict[str, str], applied: list, *, heartbeats_applied: int,
                                logs: list[tuple[int, list]]) -> None:
    """Each journaled report reached the control plane (`applied`: the instance's processed
    event ids) and took effect once: one metric point per heartbeat, and the trainer's
    output (`logs`: offset and lines of each batch) gap-free and never twice."""
    applied_ids = {str(event_id) for event_id in applied}
    missing = {e: p for e, p in journaled.items() if e not in applied_ids}
    assert not missing, (f"{len(missing)} of {len(journaled)} journaled reports never applied: "
                         f"{sorted(set(missing.values()))}")
    assert heartbeats_applied == list(journaled.values()).count("heartbeat")
    expected = 0
    for offset, lines in sorted(logs):
        assert offset == expected, (offset, expected)
        expected += len(lines)


class RedisServer(ChildProcess):
    """The test's own redis-server: nothing on disk, so a restart loses every queued message."""

    def __init__(self, log_path: Path, port: int | None = None):
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        super().__init__(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--daemonize", "no"], dict(os.environ), log_path)

    def start(self):
        super().start()
        wait_until(self._answers, timeout=30, what=f"redis-server on port {self.port}", proc=self)
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2)

    def _answers(self) -> bool:
        try:
            return self.client().ping()
        except redis.RedisError:
            return False
