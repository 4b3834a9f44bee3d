"""A job relaunched twice logs into ONE experiment-tracker run, each step once: three real
agent processes in turn (the first two preempted by SIGTERM, a notice, the third running
to the end), each resuming from the checkpoint the one before committed, with the plain
PyTorch example logging its loss by step to W&B (offline) and MLflow (a file store) through
their own client libraries."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from respawn import protocol, trackers
from respawn.agent.supervisor import trainer_env
from tests.agent.standin import StandInControlPlane, agent_argv

STEPS = 45
RUN_ID = "respawn-7-20261201T120000"
WANDB_BLOCK = 32768  # the .wandb file is a LevelDB-style log: 7-byte file header, 32 KiB blocks, 7-byte chunk headers


def wandb_records(path: Path):
    """The protobuf records of a W&B offline run file (wandb's own `Record` message)."""
    from wandb.proto import wandb_internal_pb2

    data, at, pending = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B", path
    while at + 7 <= len(data):
        if WANDB_BLOCK - at % WANDB_BLOCK < 7:  # the block's tail is padding
            at += WANDB_BLOCK - at % WANDB_BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[at:at + 7])
        if kind == 0 and length == 0:
            break
        pending += data[at + 7:at + 7 + length]
        at += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_history(wandb_dir: Path) -> tuple[set[str], list[int]]:
    """(run ids, steps of every history row) over every offline run directory W&B wrote."""
    run_ids, steps = set(), []
    for path in sorted(wandb_dir.glob("offline-run-*/run-*.wandb")):
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run_ids.add(record.run.run_id)
            elif kind == "history":
                items = {"/".join(item.nested_key) or item.key: item.value_json for item in record.history.item}
                steps.append(int(items["_step"]))
    return run_ids, steps


def tracker_env(tmp_path: Path) -> dict[str, str]:
    return {
        "WANDB_MODE": "offline", "WANDB_PROJECT": "respawn-test", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
        # nothing of W&B's in the home directory either
        **{name: str(tmp_path / "wandb-home") for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR")},
        "MLFLOW_TRACKING_URI": (tmp_path / "mlruns").as_uri(), "MLFLOW_EXPERIMENT_NAME": "spot-runs",
        "MLFLOW_ALLOW_FILE_STORE": "true",  # MLflow 3 keeps its file store behind this switch
    }


def run_one_vm(tmp_path: Path, n: int, resume: dict | None, *, preempt_after: int | None) -> dict | None:
    """One VM's agent to its end; the checkpoint it committed last (the next VM's resume point)."""
    job = protocol.JobSpec(
        job_id=7, instance_id=n, run_id=RUN_ID, env=tracker_env(tmp_path), checkpoint_uri=str(tmp_path / "ckpt"),
        command=[sys.executable, "-m", "respawn.examples.plain_pytorch", "--steps", str(STEPS), "--step-delay-s", "0.05"],
        resume_from=resume["uri"] if resume else None, resume_step=resume["step"] if resume else None,
        heartbeat_interval_s=0.2, validation=protocol.ValidationSpec(enabled=False),
    )
    plane = StandInControlPlane(job).start()
    vm = tmp_path / f"vm-{n}"
    vm.mkdir()
    agent = subprocess.Popen(agent_argv(vm, plane.url, register_timeout_s=30), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        if preempt_after is not None:
            plane.wait_for(lambda a: a[1] == protocol.PATH_HEARTBEAT and a[2].get("step", 0) >= preempt_after, 120, f"step {preempt_after}")
            agent.send_signal(signal.SIGTERM)  # the cloud's notice, as every provider also delivers it
        exit_report = plane.wait_for(lambda a: a[1] == protocol.PATH_EXIT, 120, "the exit report")[2]
        _, stderr = agent.communicate(timeout=60)
    finally:
        agent.kill()
        plane.stop()
    assert exit_report["reason"] == (protocol.ExitReason.PREEMPTED if preempt_after is not None else protocol.ExitReason.COMPLETED), stderr[-3000:]
    commits = [body for path, body in plane.accepted if path == protocol.PATH_CHECKPOINTS]
    return max(commits, key=lambda c: c["step"]) if commits else None


@pytest.fixture(autouse=True)
def mlflow_file_store(monkeypatch):
    """The test's own MLflow client reads the agents' file store too."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


@pytest.mark.timeout(420)
def test_a_job_relaunched_twice_writes_one_run_with_each_step_once(tmp_path):
    pytest.importorskip("wandb")
    mlflow = pytest.importorskip("mlflow")

    first = run_one_vm(tmp_path, 1, None, preempt_after=10)
    second = run_one_vm(tmp_path, 2, first, preempt_after=first["step"] + 10)
    assert first["kind"] == second["kind"] == "notice" and first["step"] < second["step"] < STEPS
    run_one_vm(tmp_path, 3, second, preempt_after=None)

    run_ids, steps = wandb_history(tmp_path / "wandb")
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == 3  # one offline directory per VM...
    assert run_ids == {RUN_ID}  # ...all of one run, which W&B syncs as one
    assert steps == list(range(1, STEPS + 1))

    client = mlflow.MlflowClient(tracking_uri=tracker_env(tmp_path)["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("spot-runs")
    runs = client.search_runs([experiment.experiment_id])
    assert [r.data.tags[protocol.MLFLOW_RUN_TAG] for r in runs] == [RUN_ID]
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "loss")] == list(range(1, STEPS + 1))
    assert runs[0].info.status == "FINISHED"


def test_the_trainer_gets_the_job_run_identity_but_never_over_the_jobs_own():
    job = protocol.JobSpec(job_id=7, instance_id=1, command=["x"], run_id=RUN_ID, env={"WANDB_RUN_ID": "mine", "WANDB_PROJECT": "p"})
    env = trainer_env(job, {}, base={"WANDB_RESUME": "never", "MLFLOW_RUN_ID": "stale"})
    assert (env[protocol.ENV_RUN_ID], env["WANDB_RUN_ID"], env["WANDB_RESUME"]) == (RUN_ID, "mine", "allow")
    job.env, job.secret_env = {}, {"WANDB_RUN_ID": "secret-mine"}  # a secret value is the job's own too
    assert trainer_env(job, {}, base={})["WANDB_RUN_ID"] == "secret-mine"
    job.env, job.secret_env = {protocol.ENV_RUN_ID: "chosen"}, {}
    assert trainer_env(job, {}, base={})["WANDB_RUN_ID"] == "chosen"
    job.run_id, job.env = "", {}
    assert protocol.ENV_RUN_ID not in trainer_env(job, {}, base={})


def test_a_gangs_other_ranks_wait_for_rank_0s_mlflow_run_instead_of_making_their_own(tmp_path):
    pytest.importorskip("mlflow")
    env = {**os.environ, **tracker_env(tmp_path), protocol.ENV_RUN_ID: RUN_ID}
    resolve = [sys.executable, "-m", "respawn.trackers", "mlflow-run"]
    waiters = [subprocess.Popen([*resolve, "--wait"], env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    made = subprocess.run(resolve, env=env, stdout=subprocess.PIPE, text=True, timeout=120, check=True).stdout.strip()
    assert {waiter.communicate(timeout=120)[0].strip() for waiter in waiters} == {made}
    assert trackers.resolve_mlflow_run(RUN_ID, env) == made  # a relaunched rank 0 finds it too


def test_without_mlflow_beside_the_agent_the_reason_is_said(tmp_path):
    env = {**os.environ, **tracker_env(tmp_path), protocol.ENV_RUN_ID: RUN_ID, "PYTHONPATH": str(tmp_path)}
    (tmp_path / "mlflow.py").write_text("raise ImportError('no mlflow here')\n")
    done = subprocess.run([sys.executable, "-m", "respawn.trackers", "mlflow-run"], env=env, capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 3 and "mlflow is not installed" in done.stderr and done.stdout == ""
