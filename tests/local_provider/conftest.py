"""Local VMs for the tests, under the test's own directory; every VM is terminated
at teardown and no process of any of them may be left behind."""

from __future__ import annotations

import os
import signal
import time

import pytest

from respawn_server.jobs.fleet.providers.local import LocalConfig, LocalProvider
from tests.conftest import searchable_by_vms
from tests.local_provider.helpers import STANDIN_AGENT


@pytest.fixture(autouse=True)
def vms_pass_through(tmp_path):
    searchable_by_vms(tmp_path)


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

        def left_behind() -> dict[str, set[int]]:
            vms = [vm.name for vm in root.iterdir() if vm.is_dir() and vm.name.startswith("local-")]
            return {name: pids for name in vms if (pids := provider.processes(name))}

        # A supervisor records its VM's end and then exits: a moment, on a busy machine.
        give_up = time.monotonic() + 10
        while (leaked := left_behind()) and time.monotonic() < give_up:
            time.sleep(0.1)
        for pids in leaked.values():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        assert not leaked, f"processes left behind by local VMs: {leaked}"
