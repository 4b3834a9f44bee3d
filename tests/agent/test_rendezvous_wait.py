"""A gang's rank 1 that registered before rank 0 (so with no rendezvous address, as
on a cloud) waits, heartbeating, and starts its trainer once the control plane
has rank 0's address; a stop while waiting, or no address in time, ends it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from respawn import protocol
from tests.agent.standin import StandInControlPlane, agent_argv

TRAINER_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def plane(tmp_path):
    # The trainer only writes down the environment it was started with.
    record = "import json, os, sys; json.dump({k: os.environ.get(k) for k in %r}, open(sys.argv[1], 'w'))" % (TRAINER_ENV,)
    job = protocol.JobSpec(job_id=1, instance_id=2, command=[sys.executable, "-c", record, str(tmp_path / "trainer-env.json")],
                           checkpoint_uri=str(tmp_path / "ckpt"), heartbeat_interval_s=0.1, rank=1, world_size=2)
    server = StandInControlPlane(job).start()
    yield server
    server.stop()


def start_agent(tmp_path, url: str, register_timeout_s: float = 30) -> subprocess.Popen:
    argv = agent_argv(tmp_path, url, register_timeout_s=register_timeout_s)
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finished(agent: subprocess.Popen, plane: StandInControlPlane) -> dict:
    """The agent's exit report, once the agent has exited."""
    try:
        _, stderr = agent.communicate(timeout=60)
    finally:
        agent.kill()
    assert agent.returncode == 0, stderr[-3000:]
    exits = [body for path, body in plane.accepted if path == protocol.PATH_EXIT]
    assert len(exits) == 1
    return exits[0]


def polls(plane: StandInControlPlane) -> list[str]:
    return [path for _, path, _ in plane.arrivals if path in (protocol.PATH_RENDEZVOUS, protocol.PATH_HEARTBEAT)]


def test_rank_1_waits_heartbeating_then_starts_its_trainer_with_rank_0s_address(tmp_path, plane):
    agent = start_agent(tmp_path, plane.url)
    # It asks, heartbeats meanwhile (so it is not taken for lost), and asks again.
    plane.wait_for(lambda a: polls(plane).count(protocol.PATH_RENDEZVOUS) >= 2 and protocol.PATH_HEARTBEAT in polls(plane),
                   30, "repeated rendezvous polls and a heartbeat")
    assert not (tmp_path / "trainer-env.json").exists()
    plane.rendezvous_addr = "10.0.0.7:29500"
    report = finished(agent, plane)
    assert report["reason"] == protocol.ExitReason.COMPLETED
    assert json.loads((tmp_path / "trainer-env.json").read_text()) == {
        "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29500"}


def test_a_stop_while_waiting_ends_the_agent_without_starting_the_trainer(tmp_path, plane):
    plane.body = protocol.to_dict(protocol.HeartbeatAnswer(action=protocol.Action.STOP))
    report = finished(start_agent(tmp_path, plane.url), plane)
    assert report["reason"] == protocol.ExitReason.STOPPED
    assert not (tmp_path / "trainer-env.json").exists()


def test_a_preemption_notice_while_waiting_is_reported_and_ends_the_agent(tmp_path, plane):
    agent = start_agent(tmp_path, plane.url)
    plane.wait_for(lambda a: a[1] == protocol.PATH_RENDEZVOUS, 30, "a rendezvous poll")
    agent.send_signal(signal.SIGTERM)  # the agent's own notice source, as on every provider
    report = finished(agent, plane)
    assert report["reason"] == protocol.ExitReason.PREEMPTED
    assert [body["source"] for path, body in plane.accepted if path == protocol.PATH_NOTICE] == [protocol.NoticeSource.SIGTERM]
    assert not (tmp_path / "trainer-env.json").exists()


def test_no_address_within_the_register_timeout_is_a_setup_failure(tmp_path, plane):
    report = finished(start_agent(tmp_path, plane.url, register_timeout_s=1), plane)
    assert report["reason"] == protocol.ExitReason.SETUP
    assert "no rendezvous address within 1.0s" in report["last_exception"]
    assert "rank 0 did not register" in report["output_tail"]
    assert not (tmp_path / "trainer-env.json").exists()
