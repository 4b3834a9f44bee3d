"""One experiment-tracker run per job, whichever VM runs it and however often it is relaunched.

Every VM of a job gets the same run identity in the trainer's environment:

- `RESPAWN_RUN_ID`: the job's run id, made by the control plane (JobSpec.run_id);
- `WANDB_RUN_ID` (the same id) and `WANDB_RESUME=allow`: `wandb.init()` reads both, so
  the first VM creates the run and every later one resumes it;
- `MLFLOW_RUN_ID`: `mlflow.start_run()` reads it, but it must name a run that already
  exists (`start_run` calls `get_run`, which raises RESOURCE_DOES_NOT_EXIST otherwise),
  and MLflow makes its run ids itself (`create_run` takes none). So the agent finds the
  run tagged `respawn_run_id=<RESPAWN_RUN_ID>` in the job's experiment; the job's first
  VM (rank 0) creates it (`resolve_mlflow_run`, run as `python -m respawn.trackers mlflow-run`
  in a child process with a time limit, so a slow tracking server cannot hold the agent).
  The tag is the record: relaunches, other clouds and other ranks find the same run.

A value the job's own env sets is never replaced. The training script needs nothing of
Respawn's for this: `wandb.init()` and `mlflow.start_run()` read the variables themselves
(agents/respawn/examples/plain_pytorch.py logs by step, from the step after the one it resumed at).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from respawn.protocol import ENV_RUN_ID, MLFLOW_RUN_TAG as MLFLOW_TAG
MLFLOW_RESOLVE_TIMEOUT_S = 60.0


def identity_env(run_id: str, job_env: dict[str, str]) -> dict[str, str]:
    """The run-identity variables the job's env does not already set (empty without a run id);
    a RESPAWN_RUN_ID of the job's own names the run for the trackers too."""
    run_id = job_env.get(ENV_RUN_ID) or run_id
    if not run_id:
        return {}
    ours = {ENV_RUN_ID: run_id, "WANDB_RUN_ID": run_id, "WANDB_RESUME": "allow"}
    return {name: value for name, value in ours.items() if name not in job_env}


def wants_mlflow_run(env: dict[str, str], job_env: dict[str, str]) -> bool:
    """Whether the agent should find or create the job's MLflow run: the trainer logs to an
    MLflow tracking server and the job did not pin a run of its own."""
    return bool(env.get("MLFLOW_TRACKING_URI")) and bool(env.get(ENV_RUN_ID)) and "MLFLOW_RUN_ID" not in job_env


def _experiment_id(client, env: dict[str, str], *, create: bool = True) -> str | None:
    """The experiment `mlflow.start_run()` will use in the trainer (its own precedence:
    MLFLOW_EXPERIMENT_ID, then MLFLOW_EXPERIMENT_NAME, else the default experiment); None
    when it does not exist yet and `create` is False."""
    if env.get("MLFLOW_EXPERIMENT_ID"):
        return env["MLFLOW_EXPERIMENT_ID"]
    name = env.get("MLFLOW_EXPERIMENT_NAME")
    if not name:
        return "0"
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    if not create:
        return None
    from mlflow.exceptions import MlflowException

    try:
        return client.create_experiment(name)
    except MlflowException:  # another VM of the job created it a moment ago
        return client.get_experiment_by_name(name).experiment_id


def resolve_mlflow_run(run_id: str, env: dict[str, str], *, create: bool = True, poll_s: float = 1.0) -> str:
    """The MLflow run id of the job's run (tagged `run_id`). Rank 0 creates it when it is not
    there yet; the other ranks of a gang (`create` False) wait for rank 0's, so that two
    ranks never race to make two (a node slot has one live VM, so rank 0 never races itself).
    The caller bounds the wait (the agent runs this in a child process with a time limit)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    # Only rank 0 creates the experiment too: a file store's create_experiment is no atomic
    # claim of the name, and a rank that made a second "spot-runs" would wait in it forever.
    experiment = _experiment_id(client, env, create=create)
    query = f"tags.{MLFLOW_TAG} = '{run_id}'"
    while True:
        experiment = experiment or _experiment_id(client, env, create=False)
        found = experiment is not None and client.search_runs([experiment], filter_string=query, max_results=1,
                                                              order_by=["attributes.start_time ASC"])
        if found:
            return found[0].info.run_id
        if create:
            break
        time.sleep(poll_s)
    made = client.create_run(experiment, tags={MLFLOW_TAG: run_id, "mlflow.runName": run_id})
    # FINISHED between VMs: `start_run` marks it RUNNING while a trainer logs to it, `end_run` FINISHED again.
    client.set_terminated(made.info.run_id, status="FINISHED")
    return made.info.run_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m respawn.trackers", description="Tracker runs of a Respawn job.")
    sub = parser.add_subparsers(dest="command", required=True)
    mlflow_run = sub.add_parser("mlflow-run", help=f"print the MLflow run id of the job's run ${ENV_RUN_ID} for the tracking "
                                                    "server and experiment the environment names, creating the run if there is none")
    mlflow_run.add_argument("--wait", action="store_true", help="never create it: wait until it exists (a gang's rank > 0)")
    args = parser.parse_args(argv)
    try:
        import mlflow  # noqa: F401
    except ImportError:
        print("mlflow is not installed beside the agent", file=sys.stderr)
        return 3
    print(resolve_mlflow_run(os.environ[ENV_RUN_ID], dict(os.environ), create=not args.wait))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
