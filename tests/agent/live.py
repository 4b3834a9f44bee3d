"""Helpers for tests that run a real agent process against the real control plane."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from respawn_server.jobs.core.choices import JobStatus
from tests.conftest import ChildProcess
from tests.factories import make_instance, make_job

PLAIN = [sys.executable, "-m", "respawn.examples.plain_pytorch"]


def make_running_job(team_setup, tmp_path: Path, *, steps: int = 100_000, step_delay_s: float = 0.01,
                     command: list[str] | None = None, **fields):
    owner = team_setup.people["admin"].user
    job = make_job(
        team_setup.team,
        owner,
        command=command or [*PLAIN, "--steps", str(steps), "--step-delay-s", str(step_delay_s)],
        checkpoint_uri=str(tmp_path / "ckpt"),
        total_steps=steps,
        status=JobStatus.PROVISIONING,
        **fields,
    )
    return job, make_instance(job)


class AgentProcess(ChildProcess):
    def __init__(self, env: dict, tmp_path: Path, *, url: str, bootstrap_token: str, provider: str, metadata_url: str, name: str = "agent"):
        token_file = tmp_path / f"{name}-bootstrap-token"
        token_file.write_text(bootstrap_token)
        token_file.chmod(0o600)
        self.work_dir = tmp_path / f"{name}-work"
        argv = [
            sys.executable, "-m", "respawn.agent", "run",
            "--control-plane-url", url,
            "--bootstrap-token-file", str(token_file),
            "--provider", provider,
            "--work-dir", str(self.work_dir),
            "--metadata-url", metadata_url,
            "--notice-poll-s", "0.1",
            "--tick-s", "0.05",
            "--log-batch-interval-s", "0.2",
            "--backoff-base-s", "0.05",
            "--backoff-max-s", "0.3",
            "--http-timeout-s", "2",
        ]
        super().__init__(argv, env, tmp_path / f"{name}.log")

    def trainer_pid(self) -> int | None:
        """The trainer's pid, from /proc (the agent's only child in its own session)."""
        if self.proc is None:
            return None
        for pid in children(self.proc.pid):
            try:
                if b"plain_pytorch" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return pid
            except OSError:
                continue
        return None

    def terminate(self):
        os.kill(self.proc.pid, signal.SIGTERM)


def children(parent: int) -> list[int]:
    """The pids of `parent`'s children, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
