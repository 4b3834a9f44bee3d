"""The local provider (DESIGN §10): "VMs" are detached supervisor processes on this
machine (respawn_server.jobs.fleet.providers.local_vm), preempted by a simulated spot market
(respawn_server.jobs.fleet.providers.local_market).

Each VM has a directory `<root>/<vm id>/`; its files are the provider's whole
state, so any process on the machine (every Celery worker, `make demo` stopping)
sees the same VMs. A VM is live while the process recorded in its `pid.json`
(pid and start time, so a recycled pid is not mistaken for it) runs. Launches are
serialized by a lock file, so the lookup by instance id that makes `launch`
idempotent cannot race another launch of the same instance.

A VM starts with an allow-listed environment (PATH, HOME, LANG, LC_ALL, TZ, the
agent's own settings, `agent_env`), never the launching worker's: no control-plane
setting or cloud credential reaches a job. Run as root, the
provider starts each VM's agent as a user of its own (uid `vm_id_base` + instance
id) in a group of its job's (gid `vm_id_base` + job id), unknown to /etc/passwd
and needing none: a job reads neither another VM's files, token or processes'
environments nor the control plane's var/ (search-only there, every file in it
0600). The job's group owns a local checkpoint prefix (0770), so the job's next VMs
resume from what an earlier one wrote. Run as anyone else, the VM is that user's
process, like the control plane: only its environment is clean.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import respawn
from respawn.agent.config import SETTINGS_ENV
from respawn_server.jobs.core.choices import Market
from respawn_server.jobs.fleet.providers.base import CapacityError, CloudInstance, CloudState, LaunchRequest, PrecheckError, Provider
from respawn_server.jobs.fleet.providers.local_market import MarketConfig, SpotMarket
from respawn_server.jobs.fleet.providers.local_vm import (VmDir, VmSpec, is_running, kill_vm_processes, read_json, vm_processes,
                                           write_json_atomic)

log = logging.getLogger("respawn.local")

VM_ID = re.compile(r"^local-\d+-[0-9a-f]{8}$")
MARKET_EPOCH_FILE = "market-epoch"
LAUNCH_LOCK_FILE = "launch.lock"
# A terminate repeated this long after the grace kills the VM itself: its supervisor is stuck.
TERMINATE_MARGIN_S = 2.0
# Taken from the launching process when set; with SETTINGS_ENV and agent_env, a VM's whole environment.
PASSED_ENV = ("LANG", "LC_ALL", "TZ")


@dataclass(frozen=True, kw_only=True)
class LocalConfig:
    root: str
    """Directory holding one sub-directory per VM (e.g. var/local-vms); created if missing."""
    python: str = sys.executable
    """Interpreter that runs the VM supervisor (and, by default, the agent); its directory comes first
    on the VM's PATH, so `python` in a job's command is this one."""
    agent_command: tuple[str, ...] = ()
    """The agent's program; `run` and its flags are appended. Empty: (python, "-m", "respawn.agent")."""
    agent_env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for the agent, e.g. {"RESPAWN_HEARTBEAT_INTERVAL_S": "1"}. The VM inherits
    none of the launching process's environment beyond PATH, LANG, LC_ALL, TZ and the agent's own
    settings (respawn.agent.config.SETTINGS_ENV); it does inherit its working directory."""
    zones: tuple[str, ...] = ("local-a", "local-b", "local-c")
    """Zones a placement may name (the price book lists local-a..c)."""
    market_mode: str = "none"
    """none | every | rate | trace (see respawn_server.jobs.fleet.providers.local_market)."""
    market_every_s: float = 60.0
    market_rate_per_hour: float = 1.0
    market_trace_files: Mapping[str, str] = field(default_factory=dict)
    """zone -> spot trace file, "*" for every other zone (mode trace)."""
    market_time_compression: float = 1.0
    market_seed: int = 0
    market_max_preemptions: int | None = None
    """Only the first that many spot VMs under `root` are ever preempted; None: no limit."""
    market_epoch: float | None = None
    """Epoch seconds at which the market's clock (and a trace) starts; None: the first
    use of `root`, remembered in root/market-epoch so every process shares one clock."""
    out_of_capacity_zones: frozenset[str] = frozenset()
    """Zones that refuse every launch with a capacity error."""
    notice_lead_s: float = 30.0
    """Seconds from a preemption notice to the hard kill of the VM."""
    sigterm_after_notice_s: float | None = None
    """Seconds from the notice to SIGTERM of the agent (a cloud's ACPI shutdown); None: half the lead."""
    terminate_grace_s: float = 5.0
    """On terminate: seconds between SIGTERM to the agent and SIGKILL of the whole VM."""
    boot_timeout_s: float = 30.0
    """How long `launch` waits for the supervisor to fork off and record itself."""
    boot_delay_s: float = 0.0
    """Seconds each VM waits before starting its agent: a cloud VM's boot (image, drivers, agent)."""
    vm_id_base: int = 2_000_000_000
    """Run as root, each VM's agent runs as uid vm_id_base + its instance id, in group
    vm_id_base + its job id (ids no account uses: no /etc/passwd entry is needed).
    0: as the launching user, like a provider not run as root."""

    def __post_init__(self) -> None:
        if not self.root:
            raise ValueError("LocalConfig.root is required: the directory for local VMs, e.g. var/local-vms")
        if not self.zones or not all(isinstance(z, str) and z for z in self.zones):
            raise ValueError(f"LocalConfig.zones must be non-empty zone names, got {self.zones!r}")
        object.__setattr__(self, "zones", tuple(self.zones))
        object.__setattr__(self, "agent_command", tuple(self.agent_command))
        object.__setattr__(self, "out_of_capacity_zones", frozenset(self.out_of_capacity_zones))
        unknown = sorted(self.out_of_capacity_zones - set(self.zones))
        if unknown:
            raise ValueError(f"LocalConfig.out_of_capacity_zones names zones not in zones {self.zones}: {', '.join(unknown)}")
        for name in ("notice_lead_s", "terminate_grace_s", "boot_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"LocalConfig.{name} must be > 0, got {getattr(self, name)}")
        if not self.boot_delay_s >= 0:
            raise ValueError(f"LocalConfig.boot_delay_s must be >= 0, got {self.boot_delay_s}")
        if self.sigterm_after_notice_s is not None and not 0 <= self.sigterm_after_notice_s <= self.notice_lead_s:
            raise ValueError(f"LocalConfig.sigterm_after_notice_s must be within 0..notice_lead_s ({self.notice_lead_s}), got {self.sigterm_after_notice_s}")
        if self.vm_id_base and not 1000 <= self.vm_id_base <= 2**31:
            raise ValueError(f"LocalConfig.vm_id_base must be 0 or within 1000..2**31, got {self.vm_id_base}")
        self.market_config()  # validates the market's own fields now, not at the first launch

    def market_config(self) -> MarketConfig:
        return MarketConfig(
            mode=self.market_mode,
            every_s=self.market_every_s,
            rate_per_hour=self.market_rate_per_hour,
            trace_files=self.market_trace_files,
            time_compression=self.market_time_compression,
            seed=self.market_seed,
            max_preemptions=self.market_max_preemptions,
            out_of_capacity_zones=self.out_of_capacity_zones,
        )


class LocalProvider(Provider):
    name = "local"
    boots_user_data = False  # a local VM starts the agent of this checkout (local_vm)

    def __init__(self, config: LocalConfig):
        self.config = config
        self.root = Path(config.root).resolve()
        self.isolation_off_because = isolation_off_because(config)
        if self.isolation_off_because:
            _warn_once(f"local VMs run as this provider's user (root): {self.isolation_off_because}")
        self.root.mkdir(parents=True, exist_ok=True)
        # Run as root, each VM's user enters its own directory here, and lists none.
        self.root.chmod(0o711 if self.isolates else 0o700)
        self.market = SpotMarket(config.market_config())
        if config.market_mode == "trace":
            for zone in config.zones:
                self.market.trace_for(zone)  # every zone needs a trace: say so now, not at a launch

    # --- the interface ------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> str:
        placement = request.placement
        if placement.zone not in self.config.zones:
            raise PrecheckError(f"zone {placement.zone!r} is not a local zone; local zones: {', '.join(self.config.zones)}", code="InvalidZone")
        if not request.bootstrap_token or not request.control_plane_url:
            raise PrecheckError("the local provider starts the agent itself: LaunchRequest.bootstrap_token and control_plane_url are required", code="InvalidRequest")
        with self._launch_lock():
            existing = self.find_by_instance_id(request.instance_id)
            if existing is not None:
                return existing.provider_instance_id
            now = time.time()
            spot = placement.market == Market.SPOT
            refusal = self.market.capacity_refusal(placement.zone, spot=spot, now_s=now - self._market_epoch())
            if refusal:
                raise CapacityError(refusal, code="InsufficientCapacity")
            vm_id = f"local-{request.instance_id}-{uuid.uuid4().hex[:8]}"
            vm = VmDir(self.root / vm_id)
            spec = self._spec(vm, request, now, spot)
            storage_dir = self._local_storage(request)
            if spec.run_as:
                self._check_reachable(storage_dir)
            vm.path.mkdir(mode=0o700)
            vm.work_dir.mkdir(mode=0o700)  # the VM's HOME, there before its first instruction
            if spec.run_as:
                self._hand_over(vm, storage_dir, *spec.run_as)
            vm.write_spec(spec)
            self._boot(vm, spec.agent_env)
            return vm_id

    def terminate(self, provider_instance_id: str) -> None:
        """Ask the supervisor to shut the VM down (SIGTERM to the agent, SIGKILL after
        the grace). Called again once the grace (plus a margin) has passed while it
        still runs, it kills the VM's processes itself."""
        vm = self._vm(provider_instance_id)
        if not vm.path.is_dir() or vm.ended():
            return
        requested = vm.terminate_requested()
        if requested is None:
            requested = {"requested_at": time.time()}
            write_json_atomic(vm.terminate_file, requested)
        record = vm.pid_record()
        if record is None:
            return  # not forked yet: the supervisor reads terminate.json before it boots
        pid, start_time = record["pid"], record["start_time"]
        if not is_running(pid, start_time):
            kill_vm_processes(pid, start_time)  # a supervisor killed outright may leave its session behind
            return
        if time.time() - requested["requested_at"] > self.config.terminate_grace_s + TERMINATE_MARGIN_S:
            kill_vm_processes(pid, start_time)
            vm.record_end("killed", detail="the supervisor did not shut the VM down within its grace")
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def describe(self, provider_instance_id: str) -> CloudInstance:
        vm = self._vm(provider_instance_id)
        spec = read_json(vm.spec_file)
        if spec is None:
            return CloudInstance(provider_instance_id=provider_instance_id, state=CloudState.GONE)
        return CloudInstance(
            provider_instance_id=provider_instance_id,
            state=self._state(vm, spec),
            zone=spec["zone"],
            instance_type=spec["instance_type"],
            job_id=spec["job_id"],
            instance_id=spec["instance_id"],
        )

    def list_ours(self) -> list[CloudInstance]:
        vms = []
        for entry in sorted(self.root.iterdir()):
            if entry.is_dir() and VM_ID.match(entry.name):
                vm = self.describe(entry.name)
                if vm.state != CloudState.GONE:
                    vms.append(vm)
        return vms

    def interrupt(self, provider_instance_id: str, *, with_notice: bool) -> str:
        """A drill: the VM's supervisor serves the market's notice now (then SIGTERM and the
        hard kill at the notice's deadline, as for a preemption), or with no notice kills
        the VM at once. Asked of a VM that is not running, a PrecheckError."""
        vm = self._vm(provider_instance_id)
        if self.describe(provider_instance_id).state != CloudState.RUNNING:
            raise PrecheckError(f"local VM {provider_instance_id} is not running", code="IncorrectInstanceState")
        if vm.interrupt_requested() is None:
            write_json_atomic(vm.interrupt_file, {"with_notice": with_notice, "requested_at": time.time()})
        return "the market's notice now" if with_notice else "a hard reclaim"

    # --- beyond the interface ---------------------------------------------------------
    @property
    def isolates(self) -> bool:
        """Whether VMs run as users of their own (the provider runs as root and
        they can reach their program)."""
        return os.geteuid() == 0 and bool(self.config.vm_id_base) and not self.isolation_off_because

    def terminate_all(self, *, wait_s: float = 30.0) -> list[str]:
        """Terminate every live VM under the root and wait until each is gone (what
        stopping `make demo` and test teardown need); returns the ids terminated."""
        ids = [vm.provider_instance_id for vm in self.list_ours()]
        give_up = time.monotonic() + wait_s
        left = list(ids)
        while left and time.monotonic() < give_up:
            for vm_id in left:
                self.terminate(vm_id)
            time.sleep(0.1)
            left = [vm_id for vm_id in left if self.describe(vm_id).state != CloudState.GONE]
        if left:
            raise RuntimeError(f"local VMs still running after {wait_s}s: {', '.join(left)}")
        return ids

    def vm_dir(self, provider_instance_id: str) -> VmDir:
        """The VM's directory (logs, metadata URL, pid): for tests and the demo."""
        return self._vm(provider_instance_id)

    def processes(self, provider_instance_id: str) -> set[int]:
        """Pids of the VM's live processes (supervisor, agent, trainer and their children)."""
        record = self._vm(provider_instance_id).pid_record()
        if record is None:
            return set()
        return vm_processes(record["pid"], record["start_time"])

    # --- internals ------------------------------------------------------------------
    def _vm(self, provider_instance_id: str) -> VmDir:
        if not VM_ID.match(provider_instance_id):
            raise ValueError(f"{provider_instance_id!r} is not a local VM id (local-<instance id>-<8 hex digits>)")
        return VmDir(self.root / provider_instance_id)

    def _state(self, vm: VmDir, spec: dict) -> str:
        if vm.ended():
            return CloudState.GONE
        record = vm.pid_record()
        if record is None:
            # Launched but not yet recorded: its launcher may still be booting it.
            young = time.time() - spec["launched_at"] < self.config.boot_timeout_s
            return CloudState.PENDING if young else CloudState.GONE
        return CloudState.RUNNING if is_running(record["pid"], record["start_time"]) else CloudState.GONE

    def _spec(self, vm: VmDir, request: LaunchRequest, now: float, spot: bool) -> VmSpec:
        config = self.config
        placement = request.placement
        # Keyed by our instance id, not the VM's random id: a seeded run replays the same preemptions.
        delay = self.market.preemption_delay_s(f"instance-{request.instance_id}", placement.zone, spot=spot,
                                               launched_at_s=now - self._market_epoch(),
                                               preempted_before=self._preempted_vms())
        return VmSpec(
            vm_id=vm.path.name,
            job_id=request.job_id,
            instance_id=request.instance_id,
            zone=placement.zone,
            instance_type=placement.instance_type,
            market=placement.market,
            launched_at=now,
            control_plane_url=request.control_plane_url,
            bootstrap_token=request.bootstrap_token,
            agent_command=list(config.agent_command or (config.python, "-m", "respawn.agent")),
            agent_env=self._vm_env(vm),
            run_as=[config.vm_id_base + request.instance_id, config.vm_id_base + request.job_id] if self.isolates else None,
            preempt_after_s=delay,
            notice_lead_s=config.notice_lead_s,
            sigterm_after_notice_s=config.notice_lead_s / 2 if config.sigterm_after_notice_s is None else config.sigterm_after_notice_s,
            terminate_grace_s=config.terminate_grace_s,
            boot_delay_s=config.boot_delay_s,
        )

    def _vm_env(self, vm: VmDir) -> dict[str, str]:
        """The allow-list: nothing of the launching process's beyond PATH, the locale,
        the time zone and the agent's own settings; HOME is the VM's own directory."""
        passed = {name: os.environ[name] for name in (*PASSED_ENV, *SETTINGS_ENV) if name in os.environ}
        return {**passed, "PATH": vm_path(self.config), "HOME": str(vm.work_dir), **self.config.agent_env}

    @staticmethod
    def _local_storage(request: LaunchRequest) -> Path | None:
        """The job's checkpoint folder when its storage is this machine's disk."""
        storage = urlsplit(request.storage_uri)
        return Path(storage.path).resolve() if request.storage_uri and storage.scheme in ("", "file") else None

    def _check_reachable(self, storage_dir: Path | None) -> None:
        """A VM's user must pass through every folder above its own and its job's
        storage: a PrecheckError naming the first it cannot, before any launch."""
        for path in (self.root, storage_dir.parent if storage_dir else None):
            unreachable = path and _first_unsearchable(path)
            if unreachable:
                raise PrecheckError(f"local VMs run as users of their own (the control plane runs as root) and cannot "
                                    f"reach {path}: {unreachable} lacks the search bit for others (chmod o+x "
                                    f"{unreachable}), or set the local provider's vm_id_base to 0 to run VMs as root",
                                    code="Unreachable")

    def _hand_over(self, vm: VmDir, storage_dir: Path | None, uid: int, gid: int) -> None:
        """What a VM running as `uid` needs and nothing more: to enter its directory
        (0711: it lists nothing there, and cannot replace the files this provider
        trusts), its home (0700) and, for a local checkpoint prefix, the job's folder,
        its job's group's (0770, so the job's next VMs resume from it)."""
        vm.path.chmod(0o711)
        os.chown(vm.work_dir, uid, gid)
        if storage_dir:
            for parent in reversed([storage_dir, *storage_dir.parents]):
                if not parent.exists():
                    parent.mkdir()
                    parent.chmod(0o711)  # other jobs' VMs pass through, and list nothing
            os.chown(storage_dir, 0, gid)
            storage_dir.chmod(0o770)

    def _boot(self, vm: VmDir, env: dict[str, str]) -> None:
        """Start the supervisor detached (it forks into a session of its own) and wait
        until it has recorded itself, so a lookup right after sees a live VM. The VM
        starts in this process's working directory: the checkout is the VM's image,
        and a job's relative paths and `python -m` modules resolve there. The
        supervisor gets the VM's environment too: as the same user, a job could read
        the supervisor's from /proc."""
        with open(os.open(vm.supervisor_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as out:
            try:
                launcher = subprocess.Popen(
                    [self.config.python, "-m", "respawn_server.jobs.fleet.providers.local_vm", str(vm.path)],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env,
                )
                code = launcher.wait(self.config.boot_timeout_s)
            except OSError as exc:
                vm.record_end("failed to boot", detail=str(exc))
                raise PrecheckError(f"could not start the local VM supervisor with {self.config.python}: {exc}", code="BootFailed") from None
            except subprocess.TimeoutExpired:
                launcher.kill()
                launcher.wait()
                code = None
        if code != 0 or vm.pid_record() is None:
            vm.record_end("failed to boot", detail=f"exit code {code}")
            tail = vm.supervisor_log.read_text(errors="replace")[-2000:]
            raise PrecheckError(f"the local VM supervisor for {vm.path.name} did not boot (exit code {code}): {tail}", code="BootFailed")

    def _preempted_vms(self) -> int:
        """VMs under root given a preemption at launch (read under the launch lock)."""
        count = 0
        for entry in self.root.iterdir():
            if entry.is_dir() and VM_ID.match(entry.name):
                try:
                    count += VmDir(entry).read_spec().preempt_after_s is not None
                except ValueError:
                    pass  # a VM dir whose launch failed before its spec was written
        return count

    def _market_epoch(self) -> float:
        if self.config.market_epoch is not None:
            return self.config.market_epoch
        path = self.root / MARKET_EPOCH_FILE
        if not path.exists():
            # Written whole, then linked into place: the first process to link wins,
            # and no reader ever sees a half-written file.
            tmp = path.with_name(f".{MARKET_EPOCH_FILE}.{os.getpid()}.{uuid.uuid4().hex[:6]}")
            tmp.write_text(repr(time.time()))
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
        return float(path.read_text())

    @contextmanager
    def _launch_lock(self) -> Iterator[None]:
        with open(self.root / LAUNCH_LOCK_FILE, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


def vm_path(config: LocalConfig) -> str:
    """PATH on a VM: the checkout is the VM's image and the control plane's
    interpreter its Python, so a job's `python` is that one (with torch and the
    project installed), not the first `python` of the launching shell's PATH.
    Not resolved: a virtual environment's python is a link out of it."""
    return os.pathsep.join([str(Path(config.python).parent), os.environ.get("PATH", os.defpath)])


def isolation_off_because(config: LocalConfig) -> str:
    """Run as root, why VMs cannot be users of their own: their program (the
    control plane's Python, often under a 0700 /root, as a fresh pyenv install
    leaves it), the virtual environment it is linked from, or the agent's code (a
    checkout in a 0700 `mktemp -d`) is out of their reach. The VMs then run as root,
    with the clean environment only, rather than every launch failing; '' when
    nothing stops it."""
    if os.geteuid() != 0 or not config.vm_id_base:
        return ""
    program = (config.agent_command or (config.python,))[0]
    program = Path(shutil.which(program, path=vm_path(config)) or program).absolute()
    for needed in (program, program.resolve(), Path(respawn.__file__).resolve().parent):
        unreachable = _first_unsearchable(needed)
        if unreachable:
            return (f"{needed} is out of other users' reach ({unreachable} lacks the search bit for others): "
                    f"`chmod o+x {unreachable}` runs each VM as a user of its own")
    return ""


def _first_unsearchable(path: Path) -> Path | None:
    """The first existing folder from `path` up that other users cannot pass through."""
    return next((p for p in (path, *path.parents) if p.exists() and not p.stat().st_mode & stat.S_IXOTH), None)


@functools.cache
def _warn_once(message: str) -> None:
    log.warning(message)  # once per process: providers are made for every task
