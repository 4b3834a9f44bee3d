"""Before its trainer reports a step, a resumed run's agent heartbeats the step it
resumes from, never 0: the control plane measures a run's speed and the job's
progress from these steps."""

from __future__ import annotations

import subprocess
import sys

from respawn import protocol
from tests.agent.standin import StandInControlPlane, agent_argv


def test_a_resumed_agent_heartbeats_its_resume_step_until_the_trainer_reports(tmp_path):
    # A trainer still loading its checkpoint: it runs, and reports nothing for a while.
    job = protocol.JobSpec(job_id=1, instance_id=2, command=[sys.executable, "-c", "import time; time.sleep(1.5)"],
                           checkpoint_uri=str(tmp_path / "ckpt"), heartbeat_interval_s=0.1,
                           resume_from=str(tmp_path / "ckpt" / "step-00000400"), resume_step=400)
    plane = StandInControlPlane(job).start()
    agent = subprocess.Popen(agent_argv(tmp_path, plane.url), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        plane.wait_for(lambda a: a[1] == protocol.PATH_EXIT, 60, "exit report")
    finally:
        agent.kill()
        agent.wait()
        plane.stop()
    steps = [body["step"] for _, path, body in plane.arrivals if path == protocol.PATH_HEARTBEAT]
    assert len(steps) >= 3 and set(steps) == {400}, steps
