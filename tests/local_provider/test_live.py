"""Real local VMs against the real control plane: the agent inside registers, the
VM outlives the process that launched it, and a preemption by the simulated market
reaches the agent through the VM's metadata endpoint before the VM is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from respawn_server.jobs.core.choices import InstanceState, JobStatus
from respawn_server.jobs.fleet.providers.base import CloudState
from respawn_server.jobs.models import Instance, InterruptionEvent
from tests.conftest import ROOT, wait_until
from tests.factories import make_instance, make_job
from tests.local_provider.helpers import FAST_AGENT_ENV, alive, launch_request

pytestmark = [pytest.mark.e2e, pytest.mark.store_incidental]

TRAINER = ["sleep", "600"]  # the agent's side is under test here, not training


def provisioning_instance(team_setup, tmp_path):
    job = make_job(team_setup.team, team_setup.people["admin"].user, command=TRAINER, checkpoint_uri=str(tmp_path / "ckpt"),
                   status=JobStatus.PROVISIONING)
    return make_instance(job)


def registered(instance_id: int, vm_id: str) -> bool:
    instance = Instance.objects.get(pk=instance_id)
    return instance.state == InstanceState.RUNNING and instance.provider_instance_id == vm_id


def test_a_vm_outlives_its_launcher_registers_and_is_terminated_whole(team_setup, web_server, local_provider, tmp_path):
    setup = provisioning_instance(team_setup, tmp_path)
    provider = local_provider(agent_command=(), agent_env=FAST_AGENT_ENV)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tests.local_provider.launcher", str(provider.root), str(setup.instance.pk),
         json.dumps({"agent_env": FAST_AGENT_ENV}), web_server.url, setup.bootstrap_token],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        vm_id = launcher.stdout.readline().strip()
    finally:
        os.killpg(launcher.pid, signal.SIGKILL)  # the "Celery worker" dies with everything in its group
        launcher.wait()
    assert vm_id.startswith(f"local-{setup.instance.pk}-")

    wait_until(lambda: registered(setup.instance.pk, vm_id), timeout=60, what="the agent in the VM registered")
    assert provider.describe(vm_id).state == CloudState.RUNNING
    request = launch_request(setup.instance.pk, bootstrap_token=setup.bootstrap_token, control_plane_url=web_server.url)
    assert provider.launch(request) == vm_id
    assert [vm.provider_instance_id for vm in provider.list_ours()] == [vm_id]

    wait_until(lambda: len(provider.processes(vm_id)) == 3, timeout=30, what="supervisor, agent and trainer running")
    pids = provider.processes(vm_id)
    provider.terminate(vm_id)
    wait_until(lambda: provider.describe(vm_id).state == CloudState.GONE and not any(alive(p) for p in pids), timeout=30, what="every process of the VM gone")
    assert provider.vm_dir(vm_id).ended()["reason"] == "terminated"


def test_a_market_preemption_reaches_the_agent_as_a_local_notice_and_the_vm_dies_at_the_deadline(team_setup, web_server, local_provider, tmp_path):
    setup = provisioning_instance(team_setup, tmp_path)
    # every_s leaves the agent time to register first: a notice before register has nothing to save.
    provider = local_provider(agent_command=(), agent_env=FAST_AGENT_ENV, market_mode="every", market_every_s=5.0,
                              notice_lead_s=3.0, sigterm_after_notice_s=1.5)
    request = launch_request(setup.instance.pk, bootstrap_token=setup.bootstrap_token, control_plane_url=web_server.url)
    vm_id = provider.launch(request)
    pids: set[int] = set()

    def noticed() -> bool:
        pids.update(provider.processes(vm_id))
        return InterruptionEvent.objects.filter(instance_id=setup.instance.pk).exists()

    wait_until(noticed, timeout=60, what="the notice recorded by the control plane")
    event = InterruptionEvent.objects.get(instance_id=setup.instance.pk)
    assert event.source == "local" and event.kind == "notice", event.raw
    assert Instance.objects.get(pk=setup.instance.pk).provider_instance_id == vm_id
    assert len(pids) >= 3  # supervisor, agent, trainer were all seen
    wait_until(lambda: provider.describe(vm_id).state == CloudState.GONE and not any(alive(p) for p in pids), timeout=30, what="every process of the VM gone after the deadline")
    assert provider.vm_dir(vm_id).ended()["reason"] == "preempted"
