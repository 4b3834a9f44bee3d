"""The trainer in a container image, under a real podman (respawn.agent.container):
the job's environment and paths reach it, SIGTERM reaches it, its exit status comes
back, a kill leaves no container behind; and the agent turns an image that cannot be
pulled or started into the job's setup failure, with the reason."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from respawn import protocol
from respawn.agent import container
from tests.agent.containers import IMAGE, podman  # noqa: F401  (a fixture)
from tests.agent.standin import StandInControlPlane, agent_argv


def trainer(tmp_path: Path, env: dict[str, str], script: str, *, name: str = "respawn-trainer-test"
            ) -> container.ContainerTrainer:
    work, code = tmp_path / "work", tmp_path / "code"
    work.mkdir(exist_ok=True)
    code.mkdir(exist_ok=True)
    runtime = container.find_runtime(env["PATH"])
    argv = container.run_argv(runtime=runtime, image=IMAGE, name=name, command=["sh", "-c", script], env=env,
                              cwd=str(code), mounts=[str(code), str(work)])
    return container.ContainerTrainer(argv, runtime=runtime, name=name, env=env, log_path=str(tmp_path / "log"))


def wait_for(path: Path, timeout_s: float = 60) -> None:
    end = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.05)


def test_the_trainer_gets_the_jobs_env_working_dir_and_mounted_paths_and_its_exit_status_comes_back(
        tmp_path, podman):  # noqa: F811
    status = tmp_path / "work" / "status.json"
    env = {**podman, "WANDB_PROJECT": "resnet", "HF_TOKEN": "hf_secret_value",
           protocol.ENV_STATUS_FILE: str(status)}
    run = trainer(tmp_path, env, f'echo "$WANDB_PROJECT $HF_TOKEN $(pwd)"; echo step > "${protocol.ENV_STATUS_FILE}"; '
                                 'echo "$PYTHONPATH"; exit 7')
    assert "hf_secret_value" not in " ".join(run.command)  # values travel by name, never on a command line
    run.start()
    assert run.wait(120) == 7
    lines = (tmp_path / "log").read_text().splitlines()
    assert lines[-2:] == [f"resnet hf_secret_value {tmp_path / 'code'}", container.LIB_MOUNT]
    assert status.read_text() == "step\n"  # written inside, read by the agent outside


def test_the_checkpoint_signal_and_sigterm_reach_the_trainer_and_its_status_is_kept(tmp_path, podman):  # noqa: F811
    env = {**podman, "WORK": str(tmp_path / "work")}
    run = trainer(tmp_path, env, 'trap \'echo now >> "$WORK/saves"\' USR1; '
                                 'trap \'echo saved >> "$WORK/saves"; exit 143\' TERM; touch "$WORK/ready"; '
                                 'while :; do sleep 0.1; done')
    run.start()
    wait_for(tmp_path / "work" / "ready")
    run.signal(getattr(signal, protocol.SIGNAL_CHECKPOINT_NOW))  # a checkpoint the control plane asked for
    wait_for(tmp_path / "work" / "saves")
    run.signal(signal.SIGTERM)
    assert run.wait(60) == 143
    assert (tmp_path / "work" / "saves").read_text() == "now\nsaved\n"


def test_a_kill_removes_the_container(tmp_path, podman):  # noqa: F811
    env = {**podman, "WORK": str(tmp_path / "work")}
    run = trainer(tmp_path, env, 'touch "$WORK/ready"; trap "" TERM; while :; do sleep 0.1; done', name="respawn-k")
    run.start()
    wait_for(tmp_path / "work" / "ready")
    run.kill()
    listed = subprocess.run(["podman", "ps", "--all", "--quiet", "--filter", "name=respawn-k"], env=podman,
                            capture_output=True, text=True, check=True)
    assert listed.stdout.strip() == ""


def test_a_missing_command_is_the_runtimes_status_not_the_trainers(tmp_path, podman):  # noqa: F811
    runtime = container.find_runtime(podman["PATH"])
    argv = container.run_argv(runtime=runtime, image=IMAGE, name="respawn-m", command=["python3", "train.py"],
                              env=podman, cwd=None, mounts=[])
    run = container.ContainerTrainer(argv, runtime=runtime, name="respawn-m", env=podman,
                                     log_path=str(tmp_path / "log"))
    run.start()
    code = run.wait(120)
    assert container.runtime_failure(code, (tmp_path / "log").read_text()) == "the command was not found in the image"


def test_the_image_is_never_read_as_an_option(tmp_path, podman):  # noqa: F811
    # A job stored before the API refused such an image: `--` ends the options, so the
    # runtime takes "-v/etc" as the image it is, not a volume, with the command's first word
    # (an image here) as what to run.
    runtime = container.find_runtime(podman["PATH"])
    argv = container.run_argv(runtime=runtime, image="-v/etc", name="respawn-opt", env=podman, cwd=None, mounts=[],
                              command=[IMAGE, "sh", "-c", "echo ran as an image"])
    assert argv[argv.index("-v/etc") - 1] == "--"
    ran = subprocess.run(argv, env=podman, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 125 and "invalid reference format" in ran.stderr, (ran.returncode, ran.stderr)
    assert "ran as an image" not in ran.stdout
    pull = container.pull_argv(runtime, "-v/etc")
    assert "-- \"$1\"" in pull[2] and pull[-1] == "-v/etc"
    pulled = subprocess.run(pull, env=podman, capture_output=True, text=True, timeout=120)
    assert pulled.returncode != 0 and "invalid reference format" in pulled.stderr, pulled.stderr


def container_job(image: str, command: list[str]) -> protocol.JobSpec:
    return protocol.JobSpec(job_id=1, instance_id=41, command=command, container_image=image,
                            heartbeat_interval_s=0.2, validation=protocol.ValidationSpec(enabled=False))


def run_agent(tmp_path: Path, job: protocol.JobSpec, env: dict[str, str]) -> dict:
    plane = StandInControlPlane(job).start()
    try:
        done = subprocess.run(agent_argv(tmp_path, plane.url), env=env, capture_output=True, text=True, timeout=300)
        exits = [body for path, body in plane.accepted if path == protocol.PATH_EXIT]
        assert exits, done.stderr[-3000:]
        return exits[-1]
    finally:
        plane.stop()


@pytest.mark.parametrize("image, command, reason, says", [
    ("localhost/respawn-test-missing:1", ["sh", "-c", "exit 0"], protocol.ExitReason.SETUP,
     "container image localhost/respawn-test-missing:1 could not be pulled"),
    (IMAGE, ["python3", "train.py"], protocol.ExitReason.SETUP, f"container image {IMAGE}: the command"),
    (IMAGE, ["sh", "-c", "echo Traceback; exit 3"], protocol.ExitReason.FAILED, ""),
])
def test_the_agent_reports_an_image_it_cannot_pull_or_start_as_setup_and_the_trainers_own_failure_as_failed(
        tmp_path, podman, image, command, reason, says):  # noqa: F811
    report = run_agent(tmp_path, container_job(image, command), podman)
    assert report["reason"] == reason
    assert says in report["last_exception"]
    if reason == protocol.ExitReason.FAILED:
        assert report["exit_code"] == 3
