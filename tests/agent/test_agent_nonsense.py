"""A control plane answering nonsense: logged with the raw payload, never a crash of training."""

from __future__ import annotations

import subprocess

import pytest

from respawn import protocol
from respawn.agent import EXIT_INSTANCE_ENDED
from tests.agent.live import PLAIN
from tests.agent.standin import StandInControlPlane, agent_argv


@pytest.fixture
def plane():
    server = StandInControlPlane().start()
    yield server
    server.stop()


def run_agent(tmp_path, url, timeout=120):
    return subprocess.run(agent_argv(tmp_path, url), capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    "status,answer,expected",
    [
        (200, "<html>502 Bad Gateway</html>", "unusable"),
        (200, {"agent_token": "t", "job": {"job_id": 1, "instance_id": 1, "command": "python train.py"}}, "job.command must be a non-empty list"),
        (200, {"agent_token": "t", "job": {"job_id": 1, "instance_id": 1, "command": ["python"], "heartbeat_interval_s": "10"}}, "job.heartbeat_interval_s must be a number > 0, got '10'"),
        (200, {"agent_token": "t", "job": {"job_id": 1, "instance_id": 1, "command": ["python"], "env": {"A": 1}}}, "job.env must map strings to strings"),
        (401, {"detail": "Bootstrap token already used."}, "Bootstrap token already used."),
    ],
)
def test_an_unusable_register_answer_stops_the_agent_with_the_reason(tmp_path, plane, status, answer, expected):
    plane.register_status, plane.register_answer = status, answer
    result = run_agent(tmp_path, plane.url)
    # A refused token is final (systemd must not restart the agent); other answers exit 2.
    assert result.returncode == (EXIT_INSTANCE_ENDED if status == 401 else 2)
    assert expected in result.stderr


def test_an_unreachable_control_plane_gives_up_registering_after_the_timeout(tmp_path):
    result = run_agent(tmp_path, "http://127.0.0.1:9")
    assert result.returncode == 2 and "could not register" in result.stderr


def test_nonsense_heartbeat_answers_do_not_disturb_training(tmp_path, plane):
    job = protocol.JobSpec(job_id=1, instance_id=1, command=[*PLAIN, "--steps", "40", "--step-delay-s", "0.02"], checkpoint_uri=str(tmp_path / "ckpt"), heartbeat_interval_s=0.05)
    plane.register_answer = protocol.to_dict(protocol.RegisterAnswer(agent_token="t", job=job))
    plane.body = {"action": "explode", "checkpoint_interval_s": "soon", "heartbeat_interval_s": -3}
    result = run_agent(tmp_path, plane.url)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "unknown action" in result.stderr and "explode" in result.stderr
    exits = [body for path, body in plane.accepted if path == "exit"]
    assert [(e["reason"], e["final_step"]) for e in exits] == [("completed", 40)]
