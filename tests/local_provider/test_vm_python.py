"""`python` on a local VM is the control plane's interpreter, so docs/local-job.yaml
(whose command starts with `python`) runs as is, even when the shell that started
the control plane finds another Python first (make demo does not activate .venv)."""

from __future__ import annotations

import os
import sys

from respawn_server.jobs.fleet.providers.base import CloudState
from respawn.cli.jobspec import load_job_spec
from tests.conftest import ROOT, wait_until
from tests.local_provider.helpers import launch_request

LOCAL_JOB = ROOT / "docs" / "local-job.yaml"


def test_the_local_job_files_python_on_a_vm_is_the_control_planes_with_torch_and_the_example(local_provider,
                                                                                              monkeypatch):
    command = load_job_spec(LOCAL_JOB).body["command"]
    assert command[:3] == ["python", "-m", "respawn.examples.tiny"]
    monkeypatch.setenv("PATH", os.defpath)  # a shell whose first python (if any) is the system's
    # The VM runs the job's interpreter, looked up on its PATH as the agent looks up a trainer's.
    probe = "import sys, torch, respawn.examples.tiny; print('prefix', sys.prefix)"
    provider = local_provider(agent_command=(command[0], "-c", probe))
    vm_id = provider.launch(launch_request(1))
    wait_until(lambda: provider.describe(vm_id).state == CloudState.GONE, timeout=60, what="the probe to finish")
    log = provider.vm_dir(vm_id).agent_log.read_text()
    assert f"prefix {sys.prefix}\n" in log, log
    assert provider.vm_dir(vm_id).ended()["agent_exit_code"] == 0, log
