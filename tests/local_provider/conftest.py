"""Local VMs for the tests, under the test's own directory; every VM is terminated
at teardown and no process of any of them may be left behind."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from jobs.providers.base import LaunchRequest, Placement
from jobs.providers.local import LocalConfig, LocalProvider

STANDIN_AGENT = (sys.executable, str(Path(__file__).with_name("standin_agent.py")))
# Agent settings in fractions of a second, so notices and exits are seen at once.
FAST_AGENT_ENV = {
    "RESPAWN_HEARTBEAT_INTERVAL_S": "0.2",
    "RESPAWN_NOTICE_POLL_S": "0.2",
    "RESPAWN_TICK_S": "0.05",
    "RESPAWN_LOG_BATCH_INTERVAL_S": "0.2",
    "RESPAWN_BACKOFF_BASE_S": "0.05",
    "RESPAWN_BACKOFF_MAX_S": "0.3",
    "RESPAWN_DRAIN_TIMEOUT_S": "3",
    "RESPAWN_VALIDATE": "0",
}


def launch_request(instance_id: int, *, zone: str = "local-a", market: str = "spot", job_id: int = 1,
                   bootstrap_token: str = "rsp_boot_test", control_plane_url: str = "http://127.0.0.1:9") -> LaunchRequest:
    return LaunchRequest(
        job_id=job_id,
        instance_id=instance_id,
        client_token=f"token-{instance_id}",
        placement=Placement(provider="local", region="local", zone=zone, instance_type="cpu-small", market=market),
        user_data="",
        bootstrap_token=bootstrap_token,
        control_plane_url=control_plane_url,
    )


@pytest.fixture
def local_provider(tmp_path):
    """`local_provider(**LocalConfig fields)`: a provider whose VMs live under this
    test's directory (the stand-in agent unless `agent_command` says otherwise)."""
    root = tmp_path / "vms"

    def make(**fields) -> LocalProvider:
        fields.setdefault("agent_command", STANDIN_AGENT)
        fields.setdefault("terminate_grace_s", 1.0)
        return LocalProvider(LocalConfig(root=str(root), **fields))

    yield make
    if root.exists():
        provider = LocalProvider(LocalConfig(root=str(root)))
        provider.terminate_all(wait_s=20)
        leaked = {vm.name: provider.processes(vm.name) for vm in root.iterdir() if vm.is_dir() and vm.name.startswith("local-")}
        leaked = {name: pids for name, pids in leaked.items() if pids}
        for pids in leaked.values():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        assert not leaked, f"processes left behind by local VMs: {leaked}"
