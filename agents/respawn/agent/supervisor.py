"""The trainer as a child process: its environment, its process group, its death.

The agent's signals (notice, stop, checkpoint now) go to the training processes
alone: those the checkpoint library registered in the signal-targets directory
(the script's main process; under torchrun, each rank), else the command's own
process. Never to the process group: DataLoader workers and other helpers would die
of SIGTERM before the save could run (docs/signals.md).

The trainer runs in a process group of its own and with PR_SET_PDEATHSIG = SIGKILL,
so it dies when the agent dies, even of SIGKILL. The kernel sends that signal when
the *thread* that forked the child exits, so `start()` must be called from the
agent's main thread. `kill()` ends the whole tree: the trainer's group and the groups
of the processes under it (torchrun starts each rank in a session of its own).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from respawn import protocol, trackers
from respawn.checkpoint.signals import PR_SET_PDEATHSIG, start_ticks

log = logging.getLogger(__name__)

# Variables only the agent needs; the trainer (user code) must not see them.
AGENT_ONLY_ENV = ("RESPAWN_BOOTSTRAP_TOKEN", "RESPAWN_BOOTSTRAP_TOKEN_FILE", "RESPAWN_AGENT_TOKEN")


def trainer_env(job: protocol.JobSpec, channel_env: dict[str, str], base: dict[str, str] | None = None) -> dict[str, str]:
    """The trainer's environment: the agent's, the job's own, the job's tracker run identity
    (where the job's env does not set it), then the channel contract."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in AGENT_ONLY_ENV}
    own = {**job.env, **job.secret_env}
    env.update({str(k): str(v) for k, v in own.items()})
    env.update(trackers.identity_env(job.run_id, own))
    env.update(channel_env)
    env["PYTHONUNBUFFERED"] = "1"  # output reaches the log (and the dashboard) as it is printed
    env[protocol.ENV_CHECKPOINT_URI] = job.checkpoint_uri
    optional = {
        protocol.ENV_RESUME_FROM: job.resume_from,
        protocol.ENV_CHECKPOINT_INTERVAL_S: job.checkpoint_interval_s,
        protocol.ENV_TOTAL_STEPS: job.total_steps,
        protocol.ENV_VALIDATION_MODEL_FACTORY: job.validation.model_factory,
        protocol.ENV_VALIDATION_BATCH_FACTORY: job.validation.batch_factory,
        protocol.ENV_VALIDATION_EVAL_FN: job.validation.eval_fn,
        protocol.ENV_ARTIFACT_URI: job.artifact_uri,  # set for the post step only
        protocol.ENV_ARTIFACT_DIGEST: job.artifact_digest,
    }
    for name, value in optional.items():
        if value not in (None, ""):
            env[name] = str(value)
        else:
            env.pop(name, None)
    env.update(gang_env(job))
    return env


def gang_env(job: protocol.JobSpec) -> dict[str, str]:
    """torch.distributed's own variables for a multi-node job: the node's rank and the node
    count as RANK and WORLD_SIZE (a script run once a node reads them), and the same for
    torchrun as its `PET_*` defaults (`--node-rank`, `--nnodes`, `--master-addr`,
    `--master-port`): a job's plain `torchrun --nproc-per-node 8 train.py` then forms one
    gang over its nodes. Without them each node's torchrun ran a gang of its own
    (`--nnodes` defaults to 1, the master to 127.0.0.1), N copies of the training writing
    ranks 0-7 of one checkpoint. A flag the command gives itself still wins."""
    env = {"RANK": str(job.rank), "WORLD_SIZE": str(job.world_size),
           "PET_NODE_RANK": str(job.rank), "PET_NNODES": str(job.world_size)}
    if job.rendezvous_addr:
        host, sep, port = job.rendezvous_addr.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"rendezvous address {job.rendezvous_addr!r} must look like 'host:port'")
        env.update(MASTER_ADDR=host, MASTER_PORT=port, PET_MASTER_ADDR=host, PET_MASTER_PORT=port)
    return env


# Resolved once in the parent: between fork and exec (other threads of the agent
# may hold locks the child can never take) the child only makes the call.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def die_with_parent(parent_pid: int):
    def preexec() -> None:
        if _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            os._exit(126)
        if os.getppid() != parent_pid:  # the agent died before prctl took effect
            os._exit(126)

    return preexec


class TrainerProcess:
    def __init__(self, command: list[str], *, env: dict[str, str], cwd: str | None, log_path: str):
        if not command:
            raise ValueError("the job's command is empty")
        self.command = command
        self.env = env
        self.cwd = cwd or None
        self.log_path = log_path
        self.targets_dir = env.get(protocol.ENV_SIGNAL_TARGETS_DIR)
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        """Spawn the trainer; OSError (missing command, bad cwd) propagates for a `setup` exit."""
        if self.targets_dir:  # an earlier trainer's registrations name processes gone
            shutil.rmtree(self.targets_dir, ignore_errors=True)
            os.makedirs(self.targets_dir, mode=0o700)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                self.command,
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(os.getpid()),
            )
        log.info("trainer started, pid %d: %s", self.proc.pid, self.command)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def signal(self, signum: int) -> None:
        """Send `signum` to each training process (quietly, if it is gone): those
        registered under the trainer, else the trainer's own process."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for pid in self.training_processes() or [self.proc.pid]:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def training_processes(self) -> list[int]:
        """The live processes under the trainer that registered to take the agent's
        signals; a registration whose pid now names another process is ignored."""
        if self.proc is None or not self.targets_dir:
            return []
        tree = set(descendants(self.proc.pid)) | {self.proc.pid}
        return [pid for pid in registered(self.targets_dir) if pid in tree]

    def kill(self) -> None:
        """SIGKILL the trainer and everything under it, then reap it."""
        if self.proc is None:
            return
        pids = {self.proc.pid, *descendants(self.proc.pid), *(registered(self.targets_dir) if self.targets_dir else ())}
        for group in {self.proc.pid, *(pgid(pid) for pid in pids)} - {None, os.getpgid(0)}:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()

    def wait(self, timeout_s: float) -> int | None:
        if self.proc is None:
            return None
        end = time.monotonic() + timeout_s
        while (code := self.proc.poll()) is None and time.monotonic() < end:
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))
        return code


def registered(directory: str) -> list[int]:
    """The pids the library registered in `directory` (agents/respawn/checkpoint/signals.py) whose
    process still runs: its start time matches the one it wrote."""
    found = []
    for path in Path(directory).glob("[0-9]*"):
        try:
            entry = json.loads(path.read_text())
            pid = int(entry["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if entry.get("start_ticks") is not None and start_ticks(pid) == entry["start_ticks"]:
            found.append(pid)
    return found


def descendants(root: int) -> list[int]:
    """Every process under `root`, from /proc (one read of each process's stat)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
