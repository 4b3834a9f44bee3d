"""A local VM is no window on the control plane (issue 17 item 6). Whatever user runs
the provider, a VM starts with the allow-listed environment only; run as root (as in
a container), it runs as a user of its own, in its job's group, and reads neither
another VM's token, files or processes' environments nor the control plane's
var/ (its secret key, the secrets key, the database), while its job's next VM
resumes from what it wrote. As any other user, a VM is that user's process: only
its environment is clean (README, "Security")."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from respawn.agent.config import SETTINGS_ENV
from respawn_server.jobs.core import secret_env
from respawn_server.jobs.fleet.providers.base import CloudState, PrecheckError
from respawn_server.jobs.fleet.providers.local import LocalConfig, isolation_off_because
from tests.conftest import wait_until
from tests.local_provider.helpers import FAST_AGENT_ENV, launch_request

PROBE = Path(__file__).with_name("isolation_probe.py")
ROOT = os.geteuid() == 0
# Run as root, VMs are users of their own only where they can reach the control plane's
# Python: a fresh pyenv under a 0700 /root keeps it from them (.ci/run opens the path).
ISOLATION_OFF = isolation_off_because(LocalConfig(root="unused"))
WORKER_SECRETS = {"DJANGO_SECRET_KEY": "django-key-of-the-worker", "DATABASE_URL": "postgres://u:pw@db/respawn",
                  "AWS_SECRET_ACCESS_KEY": "aws-key-of-the-worker", "RESPAWN_GCP_BILLING_API_KEY": "gcp-key",
                  "RESPAWN_PROVIDER_CONFIG": '{"aws": {"aws_secret_access_key": "k"}}', "LANG": "C.UTF-8"}


def run_probe(provider, tmp_path, instance_id: int, job_id: int, plan: dict) -> dict:
    plan_file = tmp_path / f"plan-{instance_id}.json"
    plan_file.write_text(json.dumps(plan))
    plan_file.chmod(0o644)
    request = replace(launch_request(instance_id, job_id=job_id), storage_uri=str(tmp_path / "ckpt" / f"job-{job_id}"))
    vm_id = provider(agent_command=(sys.executable, str(PROBE), str(plan_file)), agent_env=FAST_AGENT_ENV).launch(request)
    vm = provider().vm_dir(vm_id)
    wait_until(lambda: vm.ended() is not None, timeout=60, what=f"the probe on VM {vm_id} to finish")
    lines = vm.agent_log.read_text().splitlines()
    assert vm.ended()["agent_exit_code"] == 0 and lines, lines
    return json.loads(lines[-1])


def test_a_vm_starts_with_the_allow_listed_environment_only(local_provider, tmp_path, monkeypatch):
    for name, value in WORKER_SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RESPAWN_STOP_GRACE_S", "7")  # an agent setting: passed on
    seen = run_probe(local_provider, tmp_path, 1, 1, {"read": [], "list": [], "write": []})
    allowed = {"PATH", "HOME", "LANG", "LC_ALL", "TZ", *SETTINGS_ENV, *FAST_AGENT_ENV}
    assert set(seen["env"]) <= allowed, sorted(set(seen["env"]) - allowed)
    assert (seen["env"]["LANG"], seen["env"]["RESPAWN_STOP_GRACE_S"]) == ("C.UTF-8", "7")
    assert seen["env"]["HOME"].endswith("/work") and seen["home"] == "done"
    assert not any(value in json.dumps(seen) for value in WORKER_SECRETS.values() if value != "C.UTF-8")


@pytest.mark.skipif(not ROOT, reason="as any other user a local VM is that user's process: only its environment is clean")
@pytest.mark.skipif(bool(ISOLATION_OFF), reason=f"VMs run as root here: {ISOLATION_OFF}")
def test_a_vm_run_by_root_reads_nothing_of_the_control_plane_nor_of_other_vms(local_provider, tmp_path, db):
    secret_env.seal({"A": "make the secrets key"})
    control_plane = [str(settings.VAR_DIR / "secret_key"), settings.RESPAWN["SECRETS_KEY_FILE"]]
    if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        control_plane.append(connection.settings_dict["NAME"])  # the test's database, as the worker's would be
    assert all(Path(path).exists() for path in control_plane)

    other = local_provider(agent_command=(sys.executable, "-c", "import time; time.sleep(120)"),
                           agent_env={"OTHER_TEAMS_SECRET": "their-value"})
    other_vm = other.vm_dir(other.launch(replace(launch_request(2, job_id=2),
                                                 storage_uri=str(tmp_path / "ckpt" / "job-2"))))
    wait_until(lambda: len(other.processes(other_vm.path.name)) >= 2, timeout=30, what="the other team's VM to boot")
    other_pids = sorted(other.processes(other_vm.path.name))

    seen = run_probe(local_provider, tmp_path, 1, 1, {
        "read": [*control_plane, str(other_vm.token_file), str(other_vm.spec_file), str(other_vm.agent_log),
                 *[f"/proc/{pid}/environ" for pid in other_pids]],
        "list": [str(settings.VAR_DIR), str(other_vm.work_dir), str(other_vm.path.parent), str(tmp_path / "ckpt" / "job-2")],
        "write": [str(tmp_path / "ckpt" / "job-1")],
    })
    base = local_provider().config.vm_id_base
    assert (seen["uid"], seen["gid"], seen["groups"]) == (base + 1, base + 1, [])
    assert seen["read"] == dict.fromkeys(seen["read"], "PermissionError"), seen["read"]
    assert seen["list"] == dict.fromkeys(seen["list"], "PermissionError"), seen["list"]
    assert seen["write"] == {str(tmp_path / "ckpt" / "job-1"): "done"}  # its own job's checkpoints
    assert "their-value" not in json.dumps(seen)

    # The job's next VM (another user, the same group) reads and replaces what the first wrote;
    # the other team's VM gets nowhere near it.
    again = run_probe(local_provider, tmp_path, 3, 1, {"read": [], "list": [], "write": [str(tmp_path / "ckpt" / "job-1")]})
    assert again["uid"] == base + 3 and again["write"] == {str(tmp_path / "ckpt" / "job-1"): "done"}
    stranger = run_probe(local_provider, tmp_path, 4, 2, {"read": [], "list": [], "write": [str(tmp_path / "ckpt" / "job-1")]})
    assert stranger["write"] == {str(tmp_path / "ckpt" / "job-1"): "PermissionError"}
    other.terminate_all(wait_s=20)


@pytest.mark.skipif(not ROOT, reason="only a provider run as root starts VMs as other users")
@pytest.mark.skipif(bool(ISOLATION_OFF), reason=f"VMs run as root here: {ISOLATION_OFF}")
def test_a_storage_folder_no_vm_user_can_reach_is_refused_at_launch_naming_it(local_provider, tmp_path):
    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    request = replace(launch_request(1), storage_uri=str(hidden / "ckpt" / "job-1"))
    with pytest.raises(PrecheckError, match=f"{hidden} lacks the search bit for others"):
        local_provider().launch(request)
    assert [vm.state for vm in local_provider().list_ours()] in ([], [CloudState.GONE])


@pytest.mark.skipif(not ROOT, reason="only a provider run as root starts VMs as other users")
def test_a_program_other_users_cannot_reach_runs_vms_as_root_instead_of_refusing_every_launch(local_provider, tmp_path):
    hidden = tmp_path / "hidden-bin"
    hidden.mkdir(mode=0o700)
    program = hidden / "sleep"
    program.write_bytes(Path("/bin/sleep").read_bytes())
    program.chmod(0o755)
    provider = local_provider(agent_command=(str(program), "30"))
    assert not provider.isolates and f"chmod o+x {hidden}" in provider.isolation_off_because
    vm_id = provider.launch(launch_request(1))
    wait_until(lambda: provider.processes(vm_id), timeout=30, what="the VM to boot as root")
    assert {os.stat(f"/proc/{pid}").st_uid for pid in provider.processes(vm_id)} == {0}


@pytest.mark.skipif(not ROOT, reason="only a provider run as root starts VMs as other users")
def test_a_virtual_environment_in_a_hidden_checkout_runs_vms_as_root_though_its_python_links_out(tmp_path):
    # A newcomer's clone in a 0700 `mktemp -d`: the venv's python links to a reachable
    # interpreter, but the VM's user could not pass the checkout to run it.
    checkout = tmp_path / "hidden-checkout"
    (checkout / ".venv" / "bin").mkdir(parents=True)
    checkout.chmod(0o700)
    python = checkout / ".venv" / "bin" / "python"
    python.symlink_to(os.path.realpath(sys.executable))
    why = isolation_off_because(LocalConfig(root="unused", python=str(python)))
    assert f"chmod o+x {checkout}" in why, why
