"""Local VMs as processes (with a stand-in agent; test_live.py runs the real one
against the control plane): boot, idempotent launch, terminate, preemption with a
hard kill at the deadline, capacity refusals. Every check is on real processes."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest
import requests

from respawn_server.jobs.fleet.providers.base import CapacityError, CloudState, PrecheckError
from respawn_server.jobs.fleet.providers.local import LocalConfig
from respawn_server.jobs.fleet.providers.local_vm import proc_stat
from tests.conftest import ROOT, wait_until
from tests.local_provider.helpers import AWS_V100_TRACE, STANDIN_AGENT, alive, launch_request


def imds_get(base_url: str, path: str) -> requests.Response:
    token = requests.put(base_url + "/latest/api/token", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}, timeout=2).text
    return requests.get(base_url + path, headers={"X-aws-ec2-metadata-token": token}, timeout=2)


def agent_pid(provider, vm_id: str) -> int:
    """The supervisor's child: the agent."""
    supervisor = provider.vm_dir(vm_id).pid_record()["pid"]
    children = [pid for pid in provider.processes(vm_id) if (s := proc_stat(pid)) and s.ppid == supervisor]
    assert len(children) == 1, children
    return children[0]


def gone(provider, vm_id: str) -> bool:
    return provider.describe(vm_id).state == CloudState.GONE and not provider.processes(vm_id)


def test_a_vm_boots_detached_serving_its_metadata_and_running_the_agent(local_provider):
    provider = local_provider()
    vm_id = provider.launch(launch_request(11, job_id=5, bootstrap_token="rsp_boot_secret", control_plane_url="http://127.0.0.1:8000"))
    vm = provider.describe(vm_id)
    assert (vm.state, vm.job_id, vm.instance_id, vm.zone, vm.instance_type) == (CloudState.RUNNING, 5, 11, "local-a", "cpu-small")
    assert [v.provider_instance_id for v in provider.list_ours()] == [vm_id]

    files = provider.vm_dir(vm_id)
    supervisor = files.pid_record()["pid"]
    assert os.getsid(supervisor) == supervisor, "the VM must have a session of its own"
    wait_until(lambda: files.metadata_url_file.exists() and len(provider.processes(vm_id)) == 2, timeout=20, what="agent started")
    metadata_url = files.metadata_url_file.read_text()
    assert imds_get(metadata_url, "/latest/meta-data/instance-id").text == vm_id
    assert imds_get(metadata_url, "/latest/meta-data/spot/instance-action").status_code == 404

    argv = open(f"/proc/{agent_pid(provider, vm_id)}/cmdline", "rb").read().decode().split("\0")[:-1]
    assert argv[: len(STANDIN_AGENT)] == list(STANDIN_AGENT)
    flags = dict(zip(argv[len(STANDIN_AGENT) + 1 :: 2], argv[len(STANDIN_AGENT) + 2 :: 2]))
    assert argv[len(STANDIN_AGENT)] == "run"
    assert flags == {
        "--control-plane-url": "http://127.0.0.1:8000",
        "--bootstrap-token-file": str(files.token_file),
        "--provider": "local",
        "--work-dir": str(files.work_dir),
        "--metadata-url": metadata_url,
    }
    assert files.token_file.read_text() == "rsp_boot_secret"
    assert stat.S_IMODE(files.token_file.stat().st_mode) == 0o600


def test_launching_the_same_instance_again_returns_the_same_vm(local_provider):
    provider = local_provider()
    first = provider.launch(launch_request(21))
    assert provider.launch(launch_request(21)) == first
    assert provider.find_by_instance_id(21).provider_instance_id == first
    assert [v.provider_instance_id for v in provider.list_ours()] == [first]
    other = provider.launch(launch_request(22))
    assert other != first and len(provider.list_ours()) == 2


def test_concurrent_launches_of_one_instance_from_two_processes_make_one_vm(local_provider, tmp_path):
    provider = local_provider()
    config = json.dumps({"agent_command": list(STANDIN_AGENT)})
    launchers = [
        subprocess.Popen([sys.executable, "-m", "tests.local_provider.launcher", str(provider.root), "31", config],
                         cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True)
        for _ in range(2)
    ]
    try:
        ids = {launcher.stdout.readline().strip() for launcher in launchers}
    finally:
        for launcher in launchers:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    assert len(ids) == 1 and ids == {v.provider_instance_id for v in provider.list_ours()}


def test_terminate_kills_every_process_of_the_vm_even_one_that_left_its_session(local_provider):
    provider = local_provider(agent_command=(*STANDIN_AGENT, "--escape"))
    vm_id = provider.launch(launch_request(41))
    # supervisor, agent, and the grandchild that setsid()'d and was orphaned
    wait_until(lambda: len(provider.processes(vm_id)) == 3, timeout=20, what="the escaping grandchild")
    pids = provider.processes(vm_id)
    supervisor = provider.vm_dir(vm_id).pid_record()["pid"]
    escaped = [pid for pid in pids if os.getsid(pid) != supervisor]
    assert len(escaped) == 1 and proc_stat(escaped[0]).ppid == supervisor  # handed to the subreaper

    provider.terminate(vm_id)
    wait_until(lambda: gone(provider, vm_id), timeout=20, what="VM gone")
    assert not any(alive(pid) for pid in pids)
    assert provider.vm_dir(vm_id).ended()["reason"] == "terminated"
    provider.terminate(vm_id)  # again: not an error
    assert provider.list_ours() == []


def test_a_stuck_supervisor_is_killed_by_a_later_terminate(local_provider):
    provider = local_provider(terminate_grace_s=0.5)
    vm_id = provider.launch(launch_request(42))
    wait_until(lambda: len(provider.processes(vm_id)) == 2, timeout=20, what="agent started")
    pids = provider.processes(vm_id)
    os.kill(provider.vm_dir(vm_id).pid_record()["pid"], signal.SIGSTOP)  # deaf to the shutdown request
    provider.terminate_all(wait_s=20)
    assert not any(alive(pid) for pid in pids)
    assert provider.describe(vm_id).state == CloudState.GONE


def test_a_supervisor_killed_outright_takes_its_agent_along(local_provider):
    provider = local_provider()
    vm_id = provider.launch(launch_request(43))
    wait_until(lambda: len(provider.processes(vm_id)) == 2, timeout=20, what="agent started")
    pids = provider.processes(vm_id)
    os.kill(provider.vm_dir(vm_id).pid_record()["pid"], signal.SIGKILL)
    wait_until(lambda: not any(alive(pid) for pid in pids), timeout=20, what="agent died with its VM")
    assert provider.describe(vm_id).state == CloudState.GONE


def test_a_preempted_vm_serves_the_notice_then_is_killed_at_the_deadline(local_provider):
    # The stand-in ignores SIGTERM: only the hard kill at the deadline ends it.
    provider = local_provider(agent_command=(*STANDIN_AGENT, "--ignore-sigterm"), market_mode="every", market_every_s=0.5, notice_lead_s=2.0)
    vm_id = provider.launch(launch_request(51))
    files = provider.vm_dir(vm_id)
    wait_until(lambda: files.metadata_url_file.exists(), timeout=20, what="metadata served")
    metadata_url = files.metadata_url_file.read_text()
    pids: set[int] = set()

    def notice_served() -> bool:
        pids.update(provider.processes(vm_id))
        return imds_get(metadata_url, "/latest/meta-data/spot/instance-action").status_code == 200

    wait_until(notice_served, timeout=20, what="the preemption notice on the metadata endpoint")
    action = imds_get(metadata_url, "/latest/meta-data/spot/instance-action").json()
    assert action["action"] == "terminate"
    assert len(pids) == 2 and provider.describe(vm_id).state == CloudState.RUNNING
    wait_until(lambda: gone(provider, vm_id), timeout=20, what="VM gone at the deadline")
    assert not any(alive(pid) for pid in pids)
    assert files.ended()["reason"] == "preempted"


def test_no_capacity_is_a_capacity_error_and_makes_no_vm(local_provider, tmp_path):
    provider = local_provider(out_of_capacity_zones={"local-b"})
    with pytest.raises(CapacityError, match="local-b is out of capacity"):
        provider.launch(launch_request(61, zone="local-b"))
    with pytest.raises(CapacityError):
        provider.launch(launch_request(61, zone="local-b", market="on_demand"))
    assert provider.list_ours() == [] and not list(provider.root.glob("local-*"))

    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 3600}, "data": [0, 1]}))
    provider = local_provider(market_mode="trace", market_trace_files={"*": str(trace)}, market_epoch=time.time())
    with pytest.raises(CapacityError, match="no spot capacity in zone local-a at trace tick 0"):
        provider.launch(launch_request(62))
    assert provider.launch(launch_request(62, market="on_demand")).startswith("local-62-")


def test_bad_launch_requests_and_ids_are_refused_with_what_is_wrong(local_provider):
    provider = local_provider()
    with pytest.raises(PrecheckError, match="zone 'us-east-1a' is not a local zone; local zones: local-a, local-b, local-c"):
        provider.launch(launch_request(71, zone="us-east-1a"))
    with pytest.raises(PrecheckError, match="bootstrap_token and control_plane_url are required"):
        provider.launch(launch_request(71, bootstrap_token=""))
    with pytest.raises(ValueError, match="'i-0abc' is not a local VM id"):
        provider.describe("i-0abc")
    assert provider.describe("local-99-0123abcd").state == CloudState.GONE
    provider.terminate("local-99-0123abcd")


@pytest.mark.parametrize(
    "fields,complaint",
    [
        (dict(root=""), "root is required"),
        (dict(out_of_capacity_zones={"mars-1"}), "not in zones .* mars-1"),
        (dict(notice_lead_s=2, sigterm_after_notice_s=3), "sigterm_after_notice_s must be within 0..notice_lead_s"),
        (dict(terminate_grace_s=0), "terminate_grace_s must be > 0"),
        (dict(market_mode="trace"), "needs trace_files"),
        (dict(market_mode="trace", market_trace_files={"*": "/nonexistent.json"}), "does not exist"),
        (dict(market_mode="trace", market_trace_files={"local-a": AWS_V100_TRACE}), "no spot trace for zone 'local-b'"),
    ],
)
def test_bad_local_settings_are_refused_with_the_field_named(tmp_path, fields, complaint):
    from respawn_server.jobs.fleet.providers.local import LocalProvider

    with pytest.raises(ValueError, match=complaint):
        LocalProvider(LocalConfig(**{"root": str(tmp_path / "vms"), **fields}))


def test_a_vm_whose_agent_cannot_start_shuts_down_saying_why(local_provider, tmp_path):
    provider = local_provider(agent_command=(str(tmp_path / "no-such-agent"),))
    vm_id = provider.launch(launch_request(81))
    wait_until(lambda: provider.describe(vm_id).state == CloudState.GONE, timeout=20, what="VM gone")
    assert provider.vm_dir(vm_id).ended()["reason"] == "agent failed to start"
    assert "no-such-agent" in provider.vm_dir(vm_id).supervisor_log.read_text()


def test_a_supervisor_that_cannot_start_is_a_precheck_error_and_leaves_no_live_vm(local_provider, tmp_path):
    provider = local_provider(python=str(tmp_path / "no-such-python"))
    with pytest.raises(PrecheckError, match="could not start the local VM supervisor with .*no-such-python"):
        provider.launch(launch_request(82))
    assert provider.list_ours() == [] and provider.find_by_instance_id(82) is None


def test_a_seeded_market_gives_an_instance_the_same_preemption_time_in_every_run(tmp_path):
    from respawn_server.jobs.fleet.providers.local import LocalProvider

    def preempt_after(run: str, seed: int) -> float:
        provider = LocalProvider(LocalConfig(root=str(tmp_path / run), agent_command=STANDIN_AGENT, market_mode="rate",
                                             market_rate_per_hour=3600.0, market_seed=seed))
        try:
            vm_id = provider.launch(launch_request(91))
            return provider.vm_dir(vm_id).read_spec().preempt_after_s
        finally:
            provider.terminate_all(wait_s=20)

    first = preempt_after("run-1", seed=5)
    assert first == preempt_after("run-2", seed=5)
    assert first != preempt_after("run-3", seed=6)


def test_a_market_limited_to_two_preemptions_lets_the_third_spot_vm_run_on(local_provider):
    provider = local_provider(market_mode="every", market_every_s=600.0, market_max_preemptions=2)
    on_demand = provider.launch(launch_request(101, market="on_demand"))  # never preempted: not counted
    spot = [provider.launch(launch_request(i)) for i in (102, 103, 104)]
    delays = [provider.vm_dir(vm_id).read_spec().preempt_after_s for vm_id in (on_demand, *spot)]
    assert delays == [None, 600.0, 600.0, None]
    # A launch retried for an instance that has its VM keeps that VM's fate.
    assert provider.launch(launch_request(102)) == spot[0]
