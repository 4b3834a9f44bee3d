"""Plays a cloud's VMs on this machine, for whole-system tests on AWS (moto), GCP
and Azure (our emulators): whatever VM the control plane launches on the emulated
cloud boots here, and ends when the cloud says it is gone.

A played VM is
- its boot script, read back from the cloud exactly as the provider sent it (EC2's
  `userData` attribute, the Compute instance's `startup-script` metadata, the ARM
  VM's `customData`), written where cloud-init puts it and run through its own
  shebang, as root's boot would;
- its metadata service: respawn.metadata_server in the cloud's flavour, answering
  what the cloud's own would about the VM (EC2's instance id; Compute's numeric
  id, name and zone; ARM's vmId and name) and serving notices when a test asks;
- a process session, powered off when the VM disappears from the cloud (a spot
  reclaim, a terminate by the control plane): SIGTERM to the agent (what systemd
  does at shutdown with KillMode=mixed), SIGKILL to the rest after a grace.

What a test machine must not do, the script itself switches off through variables
no cloud sets (jobs/fleet/providers/base.py render_user_data): RESPAWN_ROOT puts the
files it writes (token, unit, /usr/local/bin link) under the VM's scratch root,
and RESPAWN_NO_SYSTEMD execs the unit's command line instead of `systemctl enable
--now` (so no Restart=on-failure here). `python3` on the VM's PATH is this
checkout's virtualenv: the script fetches the agent's wheel from the control plane
with the VM's bootstrap token, checks its SHA-256 and installs it under the VM's
root (`pip --target`), its pinned requirements being those of that virtualenv
(already satisfied: nothing is downloaded), and the agent and trainer run from that
copy of `agents/`, not the checkout's. The agent finds its
metadata service through RESPAWN_METADATA_URL (169.254.169.254 is not ours to
serve) and polls it every RESPAWN_NOTICE_POLL_S (AWS's 5 s is slow for a test).
"""

from __future__ import annotations

import base64
import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from respawn.metadata_server import MetadataServer

CLOUD_INIT_SCRIPT = "var/lib/cloud/instance/scripts/part-001"
IMAGE_DIRS = ("etc/systemd/system", "usr/local/bin", "root", "tmp")  # what a VM image has before boot
WATCH_S = 0.1


@dataclass(frozen=True)
class CloudVm:
    """A live VM as its cloud's API shows it."""

    provider_instance_id: str  # what our provider module calls it
    user_data: str
    identity: dict[str, str]  # what the VM's metadata service says about it (MetadataServer's keywords)


class Cloud(Protocol):
    name: str  # the provider's name, also its metadata flavour

    def live_vms(self) -> list[CloudVm]: ...

    def reclaim(self, provider_instance_id: str) -> None:
        """What the cloud does at the end of a spot interruption."""


class Ec2Cloud:
    """EC2 as moto serves it, read with boto3."""

    name = "aws"

    def __init__(self, ec2):
        self.ec2 = ec2
        self._user_data: dict[str, str] = {}

    def live_vms(self) -> list[CloudVm]:
        pages = self.ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "tag-key", "Values": ["respawn:instance"]},
                     {"Name": "instance-state-name", "Values": ["pending", "running"]}])
        ids = [vm["InstanceId"] for page in pages for r in page["Reservations"] for vm in r["Instances"]]
        return [CloudVm(vm_id, self._read_user_data(vm_id), {"instance_id": vm_id}) for vm_id in ids]

    def _read_user_data(self, vm_id: str) -> str:
        if vm_id not in self._user_data:
            attribute = self.ec2.describe_instance_attribute(InstanceId=vm_id, Attribute="userData")
            self._user_data[vm_id] = base64.b64decode(attribute["UserData"]["Value"]).decode()
        return self._user_data[vm_id]

    def reclaim(self, provider_instance_id: str) -> None:
        self.ec2.terminate_instances(InstanceIds=[provider_instance_id])


class ComputeCloud:
    """Compute Engine as tests.emulators.gcp_compute serves it."""

    name = "gcp"

    def __init__(self, gce):
        self.gce = gce

    def live_vms(self) -> list[CloudVm]:
        with self.gce.lock:
            return [CloudVm(f"{zone}/{name}", self.gce.startup_script(zone, name),
                            {"instance_id": vm["id"], "name": name, "zone": zone})
                    for (zone, name), vm in self.gce.instances.items() if vm["status"] in ("PROVISIONING", "RUNNING")]

    def reclaim(self, provider_instance_id: str) -> None:
        zone, _, name = provider_instance_id.partition("/")
        self.gce.preempt(zone, name)


class ArmCloud:
    """Azure VMs as tests.emulators.azure_compute serves them."""

    name = "azure"

    def __init__(self, arm):
        self.arm = arm

    def live_vms(self) -> list[CloudVm]:
        with self.arm.lock:
            return [CloudVm(name, self.arm.custom_data(name), {"instance_id": vm["properties"]["vmId"], "name": name})
                    for name, vm in self.arm.vms.items() if self.arm.power.get(name) in ("starting", "running")]

    def reclaim(self, provider_instance_id: str) -> None:
        self.arm.evict(provider_instance_id)


class PlayedVm:
    """One VM's boot, metadata service and processes."""

    def __init__(self, vm: CloudVm, flavour: str, root: Path):
        self.vm, self.root = vm, root
        self.metadata = MetadataServer(flavour, **vm.identity)
        self.log_path = root / "console.log"
        self.proc: subprocess.Popen | None = None
        self.powered_off = False
        self._power = threading.Lock()

    @property
    def state_dir(self) -> Path:
        return self.root / "var/lib/respawn"

    def boot(self) -> "PlayedVm":
        for d in IMAGE_DIRS:
            (self.root / d).mkdir(parents=True, exist_ok=True)
        script = self.root / CLOUD_INIT_SCRIPT
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(self.vm.user_data)
        script.chmod(0o700)
        self.metadata.start()
        env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.root / "root"),
            "TMPDIR": str(self.root / "tmp"),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "RESPAWN_ROOT": str(self.root),
            "RESPAWN_NO_SYSTEMD": "1",
            "RESPAWN_METADATA_URL": self.metadata.url,
            "RESPAWN_NOTICE_POLL_S": "0.2",
        }
        with open(self.log_path, "ab") as console:
            self.proc = subprocess.Popen([str(script)], cwd=self.root, env=env, stdout=console,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def notice(self, *, deadline_in_s: float) -> None:
        """The cloud announces the reclaim on the VM's metadata service."""
        self.metadata.schedule_notice(in_s=0, deadline_in_s=deadline_in_s)

    def power_off(self, grace_s: float, *, then=lambda: None) -> None:
        """Shutdown: SIGTERM to the agent and `grace_s` to exit, then everything of the VM
        is killed, and `then` runs at once. Once. No grace is a power cut: a SIGTERM even a
        moment before the kill let the agent report a notice now and then, which a lost VM
        never sends."""
        with self._power:
            if self.powered_off:
                return
            self.powered_off = True
            if grace_s > 0 and self.proc.poll() is None:
                _signal_group(self.proc.pid, signal.SIGTERM, whole_group=False)
                try:
                    self.proc.wait(grace_s)
                except subprocess.TimeoutExpired:
                    pass
            _signal_group(self.proc.pid, signal.SIGKILL, whole_group=True)
            then()
            self.proc.wait()
            self.metadata.stop()

    def console(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def trainer_log(self) -> str:
        path = self.state_dir / "work" / "trainer.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _signal_group(pid: int, sig: int, *, whole_group: bool) -> None:
    try:
        os.killpg(pid, sig) if whole_group else os.kill(pid, sig)
    except ProcessLookupError:
        pass


class VmPlayer:
    """Boots every VM the cloud launches, in launch order, and powers each off once
    the cloud no longer lists it. Use as a context manager; `.vms` in boot order."""

    def __init__(self, cloud: Cloud, root: Path, *, shutdown_grace_s: float = 5.0):
        self.cloud, self.root, self.shutdown_grace_s = cloud, root, shutdown_grace_s
        self.vms: list[PlayedVm] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"vm-player-{cloud.name}", daemon=True)

    def __enter__(self) -> "VmPlayer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        for vm in self.vms:
            vm.power_off(grace_s=0)

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_S):
            try:
                self._sync()
            except Exception as exc:  # noqa: BLE001 -- kept for the test to raise, not lost in a thread
                self.errors.append(exc)
                return

    def _sync(self) -> None:
        live = {vm.provider_instance_id: vm for vm in self.cloud.live_vms()}
        known = {played.vm.provider_instance_id for played in self.vms}
        for vm_id, vm in live.items():
            if vm_id not in known:
                name = re.sub(r"[^A-Za-z0-9_.-]", "_", vm_id)
                self.vms.append(PlayedVm(vm, self.cloud.name, self.root / name).boot())
        for played in self.vms:
            if played.vm.provider_instance_id not in live and not played.powered_off:
                # In the background: a shutdown's grace must not hold up the next boot.
                threading.Thread(target=played.power_off, args=(self.shutdown_grace_s,), daemon=True).start()

    def booted(self, count: int) -> bool:
        """Whether `count` VMs have booted (raises what the watcher met, if anything)."""
        if self.errors:
            raise self.errors[0]
        return len(self.vms) >= count

    def reclaim(self, played: PlayedVm, *, hard: bool = False) -> None:
        """The cloud takes the VM back. `hard`: its power goes first, with no shutdown
        (a host failure); otherwise the watcher shuts it down once it is gone."""
        reclaim = lambda: self.cloud.reclaim(played.vm.provider_instance_id)  # noqa: E731
        if hard:
            # The cloud's deletion follows the kill at once: waiting for the processes and
            # the metadata server first could outlast a heartbeat timeout on a busy
            # machine, and the control plane would find (and end) the VM before the cloud.
            played.power_off(grace_s=0, then=reclaim)
        else:
            reclaim()

    def story(self) -> str:
        """Each VM's console and trainer log tails, for a failure message."""
        errors = "".join(f"--- the VM player stopped: {exc!r}\n" for exc in self.errors)
        return errors + "\n".join(f"--- VM {p.vm.provider_instance_id} console:\n{p.console()[-3000:]}\n"
                         f"--- trainer.log:\n{p.trainer_log()[-1500:]}" for p in self.vms)
