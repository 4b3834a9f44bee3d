"""An agent restarted on its VM (systemd's Restart=on-failure after a crash or a
SIGKILL) resumes the session register gave it: no second register (the bootstrap
token is single-use), its trainer resumes from the newest checkpoint it had
committed, and a control plane that ended the instance meanwhile ends the agent
for good, without a trainer."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from respawn import protocol
from respawn.agent import EXIT_INSTANCE_ENDED
from respawn.agent.session import SESSION_NAME
from respawn.checkpoint.reader import committed
from respawn.checkpoint.storage import open_storage
from tests.agent.live import alive, children
from tests.agent.standin import StandInControlPlane, agent_argv
from tests.conftest import wait_until

STEPS, EVERY = 80, 10


def start(tmp_path: Path, url: str) -> subprocess.Popen:
    return subprocess.Popen(agent_argv(tmp_path, url, register_timeout_s=30), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finish(agent: subprocess.Popen) -> str:
    try:
        _, stderr = agent.communicate(timeout=90)
    finally:
        agent.kill()
    return stderr


def kill_with_its_trainer(agent: subprocess.Popen) -> None:
    """SIGKILL, as the OOM killer or a crash would end it; the trainer dies with it."""
    trainers = children(agent.pid)
    agent.send_signal(signal.SIGKILL)
    agent.communicate(timeout=30)
    for pid in trainers:
        wait_until(lambda: not alive(pid), timeout=10, what="the trainer to die with its agent")


def registers(plane: StandInControlPlane) -> int:
    return sum(1 for _, path, _ in plane.arrivals if path == protocol.PATH_REGISTER)


def job_spec(tmp_path: Path, command: list[str], **fields) -> protocol.JobSpec:
    return protocol.JobSpec(job_id=1, instance_id=7, command=command, checkpoint_uri=str(tmp_path / "ckpt"), heartbeat_interval_s=0.1,
                            validation=protocol.ValidationSpec(enabled=False), **fields)


@pytest.fixture
def plane():
    server = StandInControlPlane().start()
    yield server
    server.stop()


def test_a_killed_agent_restarted_resumes_its_session_from_the_newest_checkpoint(tmp_path, plane):
    # The spec resumes from step 10 (as if an earlier instance committed it; this
    # trainer commits it first), older than what this instance commits before it is killed.
    resume_from = f"{tmp_path / 'ckpt'}/step-{EVERY:08d}"
    command = [sys.executable, "-m", "respawn.examples.tiny", "--steps", str(STEPS), "--every-steps", str(EVERY), "--step-delay", "0.02"]
    plane.register_answer = protocol.to_dict(protocol.RegisterAnswer(
        agent_token="standin-agent-token", job=job_spec(tmp_path, command, resume_from=resume_from, resume_step=EVERY)))
    work = tmp_path / "work"

    agent = start(tmp_path, plane.url)
    try:
        plane.wait_for(lambda a: a[1] == protocol.PATH_CHECKPOINTS and a[2]["step"] >= 3 * EVERY, 60, "a checkpoint at step 30")
    finally:
        kill_with_its_trainer(agent)
    first = [json.loads(line) for line in (work / "channel" / "checkpoints.jsonl").read_text().splitlines()]
    newest = max(c["step"] for c in first)
    assert committed(open_storage(str(tmp_path / "ckpt")))[-1].step == newest  # the newest in the job's storage

    agent = start(tmp_path, plane.url)  # the same command line, as systemd restarts it
    stderr = finish(agent)
    assert agent.returncode == 0, stderr[-3000:]
    assert registers(plane) == 1
    assert "resuming session of instance 7 after a restart" in stderr

    reports = [(arrived, body) for arrived, path, body in plane.arrivals if path == protocol.PATH_CHECKPOINTS]
    before = {c["checkpoint_id"] for c in first}
    assert before <= {body["checkpoint_id"] for _, body in reports}  # those the killed agent had not sent, too
    resumed = sorted({body["checkpoint_id"]: body["step"] for _, body in reports if body["checkpoint_id"] not in before}.values())
    # The trainer went on from the newest checkpoint, not from the spec's (step 10).
    assert resumed and resumed[0] == newest + EVERY, (newest, resumed)
    # A report resent after the restart keeps its event_id: the control plane applies it once.
    assert len({body["event_id"] for _, body in reports}) == len({body["checkpoint_id"] for _, body in reports})
    exits = [body for path, body in plane.accepted if path == protocol.PATH_EXIT]
    assert [(e["reason"], e["final_step"]) for e in exits] == [("completed", STEPS)]
    # The output goes on where it stopped: no line offset shipped twice or skipped.
    batches = sorted((body["offset"], len(body["lines"])) for path, body in plane.accepted if path == protocol.PATH_LOGS)
    assert [offset for offset, _ in batches] == [sum(n for _, n in batches[:i]) for i in range(len(batches))]

    # Started once more (a reboot): the session ended, so nothing runs again.
    again = start(tmp_path, plane.url)
    stderr = finish(again)
    assert again.returncode == 0 and "ended before this start" in stderr, stderr[-3000:]
    assert registers(plane) == 1 and "trainer started" not in stderr


def started_trainer(tmp_path: Path) -> list[str]:
    """A trainer that only notes each start, then waits to be stopped."""
    marker = tmp_path / "trainer-starts"
    script = "import sys, time; open(sys.argv[1], 'a').write('started\\n'); time.sleep(60)"
    return [sys.executable, "-c", script, str(marker)]


def run_then_kill(tmp_path: Path, plane: StandInControlPlane) -> None:
    plane.register_answer = protocol.to_dict(protocol.RegisterAnswer(agent_token="standin-agent-token", job=job_spec(tmp_path, started_trainer(tmp_path))))
    agent = start(tmp_path, plane.url)
    try:
        wait_until(lambda: (tmp_path / "trainer-starts").exists(), timeout=30, what="the trainer to start")
        plane.wait_for(lambda a: a[1] == protocol.PATH_HEARTBEAT, 30, "a heartbeat")
    finally:
        kill_with_its_trainer(agent)


def test_a_401_on_the_stored_token_ends_the_agent_for_good_without_a_trainer(tmp_path, plane):
    run_then_kill(tmp_path, plane)
    plane.status, plane.body = 401, {"detail": "Agent token revoked: the instance ended."}

    agent = start(tmp_path, plane.url)
    stderr = finish(agent)
    assert agent.returncode == EXIT_INSTANCE_ENDED, stderr[-3000:]
    assert "refused the stored agent token of instance 7 (HTTP 401)" in stderr and "not restarting the trainer" in stderr
    assert (tmp_path / "trainer-starts").read_text().splitlines() == ["started"]
    assert registers(plane) == 1


def test_a_session_file_others_can_read_is_refused(tmp_path, plane):
    run_then_kill(tmp_path, plane)
    (tmp_path / "work" / SESSION_NAME).chmod(0o644)
    heartbeats = sum(1 for _, path, _ in plane.arrivals if path == protocol.PATH_HEARTBEAT)

    agent = start(tmp_path, plane.url)
    stderr = finish(agent)
    assert agent.returncode == 2, stderr[-3000:]
    assert "session file" in stderr and "accessible by group or others (mode 0644)" in stderr
    assert (tmp_path / "trainer-starts").read_text().splitlines() == ["started"]
    assert registers(plane) == 1
    assert sum(1 for _, path, _ in plane.arrivals if path == protocol.PATH_HEARTBEAT) == heartbeats
