"""The job's MLflow run for this VM's trainer (respawn.trackers), found with a time limit."""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

from respawn import trackers

if TYPE_CHECKING:
    from respawn.agent.lifecycle import Agent


def find_mlflow_run(agent: Agent, env: dict[str, str]) -> None:
    """Set MLFLOW_RUN_ID to the job's MLflow run (respawn.trackers), in a child process with a
    time limit: a slow or absent tracking server must not hold the VM. Without it the
    trainer still runs, logging to a run of its own, and the job's output says why."""
    argv = [sys.executable, "-m", "respawn.trackers", "mlflow-run", *(["--wait"] if agent.state.job.rank > 0 else [])]
    try:
        done = subprocess.run(argv, env=env, cwd=agent.state.job.working_dir or None, capture_output=True, text=True,
                              timeout=trackers.MLFLOW_RESOLVE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        agent.agent_line(f"the MLflow tracking server did not answer within {trackers.MLFLOW_RESOLVE_TIMEOUT_S:.0f}s; "
                         "this VM's trainer logs to an MLflow run of its own")
        return
    run_id = done.stdout.strip()
    if done.returncode != 0 or not run_id:
        why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1][:300]
        agent.agent_line(f"could not find or create the job's MLflow run ({why}); this VM's trainer logs to an MLflow run of its own")
        return
    env["MLFLOW_RUN_ID"] = run_id
    agent.agent_line(f"MLflow run {run_id} ({trackers.MLFLOW_TAG}={env[trackers.ENV_RUN_ID]})")
