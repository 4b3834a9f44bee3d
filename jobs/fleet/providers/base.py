"""The one interface every cloud provider implements (AWS, GCP, Azure, local).

No Django here: providers take plain dataclasses in and give plain dataclasses
back, so they can be tested against emulators without a database and called
from Celery tasks that own all the state.
"""

from __future__ import annotations

import shlex
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import agents
from agents.agent import EXIT_INSTANCE_ENDED
from jobs.core.choices import Market

TAG_JOB = "respawn:job"
TAG_INSTANCE = "respawn:instance"
# GCP labels allow only [a-z0-9_-]: the same keys, spelled for labels.
LABEL_JOB = "respawn-job"
LABEL_INSTANCE = "respawn-instance"


class CloudState:
    """An instance's state as the cloud reports it, mapped to four words."""

    PENDING = "pending"
    RUNNING = "running"
    STOPPED = "stopped"  # e.g. an Azure VM deallocated by eviction: can be started again
    GONE = "gone"  # terminated, deleted, or not found
    ALL = (PENDING, RUNNING, STOPPED, GONE)


@dataclass(frozen=True, kw_only=True)
class Placement:
    provider: str
    region: str
    zone: str
    instance_type: str
    market: str = Market.SPOT


@dataclass(kw_only=True)
class LaunchRequest:
    job_id: int
    instance_id: int  # our Instance row's id
    client_token: str  # a UUID made when the Instance row is created, before the call
    placement: Placement
    user_data: str  # the boot script: installs and starts the agent
    # What the boot script carries, for providers that start the agent themselves (local).
    bootstrap_token: str = ""
    control_plane_url: str = ""
    max_price_per_hour: float | None = None
    machine_image: str = ""  # the job's boot image on this cloud (AMI, GCE image, URN); empty: the provider's
    extra_tags: dict[str, str] = field(default_factory=dict)


@dataclass(kw_only=True)
class CloudInstance:
    provider_instance_id: str
    state: str  # a CloudState
    zone: str = ""
    instance_type: str = ""
    job_id: int | None = None
    instance_id: int | None = None


class ProviderError(Exception):
    """A cloud call failed. `kind` says what the orchestrator should do next."""

    kind = "transient"

    def __init__(self, message: str, *, code: str = ""):
        super().__init__(message)
        self.code = code


class CapacityError(ProviderError):
    """No capacity for this placement now: try another placement."""

    kind = "capacity"


class PrecheckError(ProviderError):
    """Quota, credentials or an invalid spec: fail the job with the cloud's message."""

    kind = "prechecks"


class TransientError(ProviderError):
    """Throttling, a 5xx, a timeout: retry the same call later."""

    kind = "transient"


class Provider(ABC):
    name: str
    # Whether a VM in CloudState.STOPPED still costs money (e.g. an Azure VM
    # deallocated by eviction keeps its disk): the ledger says so while it lasts.
    bills_storage_when_stopped: bool = False
    # The price SKU of that storage (a DiskPriceQuote's sku), recorded on each spot
    # instance at launch; empty when a stopped VM bills nothing.
    stopped_storage_sku: str = ""

    @abstractmethod
    def launch(self, request: LaunchRequest) -> str:
        """Start a VM and return its provider instance id.

        Idempotent: if an instance tagged with `request.instance_id` already
        exists, its id is returned and no second VM is made.
        """

    @abstractmethod
    def terminate(self, provider_instance_id: str) -> None:
        """Stop billing for the VM. Terminating one that is already gone is not an error."""

    @abstractmethod
    def describe(self, provider_instance_id: str) -> CloudInstance:
        """The VM as the cloud sees it now (state GONE when it does not exist)."""

    @abstractmethod
    def list_ours(self) -> list[CloudInstance]:
        """Every live VM carrying our tags/labels, whoever launched it."""

    def find_by_instance_id(self, instance_id: int) -> CloudInstance | None:
        for vm in self.list_ours():
            if vm.instance_id == instance_id and vm.state != CloudState.GONE:
                return vm
        return None


AGENT_VERSION = agents.__version__
AGENT_UNIT = "/etc/systemd/system/respawn-agent.service"
AGENT_BIN = "/usr/local/bin/respawn-agent"
STATE_DIR = "/var/lib/respawn"
TOKEN_FILE = f"{STATE_DIR}/bootstrap-token"
WORK_DIR = f"{STATE_DIR}/work"
# Paths the boot script writes: under $RESPAWN_ROOT when a test plays the VM, under / on a VM.
SYSTEM_PATHS = (AGENT_UNIT, AGENT_BIN, STATE_DIR, TOKEN_FILE, WORK_DIR)


def systemd_quote(value: str) -> str:
    """One ExecStart argument, literal: systemd would otherwise expand % specifiers and $VARS."""
    if any(ch in value for ch in "\n\r\0"):
        raise ValueError(f"a systemd argument cannot contain a line break or NUL: {value!r}")
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


def shell_word(value: str) -> str:
    """One bash word, literal, except that our system paths are placed under "$root"."""
    return f'"$root"{shlex.quote(value)}' if value in SYSTEM_PATHS else shlex.quote(value)


def agent_argv(*, control_plane_url: str, provider: str) -> list[str]:
    """The agent's command line on a VM: what the unit runs."""
    return [AGENT_BIN, "run", "--control-plane-url", control_plane_url, "--bootstrap-token-file", TOKEN_FILE,
            "--provider", provider, "--work-dir", WORK_DIR]


def render_agent_unit(*, control_plane_url: str, provider: str) -> str:
    """The systemd unit that keeps the agent running: restarted when it fails (it
    resumes its session: agents.agent.session), a bounded number of times so a
    broken agent does not spin forever, and not once its instance has ended."""
    argv = agent_argv(control_plane_url=control_plane_url, provider=provider)
    return "\n".join(
        [
            "[Unit]",
            "Description=Respawn agent: runs and checkpoints this VM's training job",
            "Wants=network-online.target",
            "After=network-online.target",
            "StartLimitIntervalSec=600",
            "StartLimitBurst=5",
            "",
            "[Service]",
            "Type=simple",
            "ExecStart=" + " ".join(systemd_quote(arg) for arg in argv),
            "Restart=on-failure",
            "RestartSec=5",
            # A restarted agent resumes its session; this status says the control plane
            # refused it (the instance ended meanwhile): nothing left to restart for.
            f"RestartPreventExitStatus={EXIT_INSTANCE_ENDED}",
            # The agent forwards SIGTERM to the trainer and saves a checkpoint: give it time.
            "KillMode=mixed",
            "TimeoutStopSec=120",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            "",
        ]
    )


def render_user_data(*, control_plane_url: str, bootstrap_token: str, provider: str,
                     agent_package: str = f"respawn[agent]=={AGENT_VERSION}") -> str:
    """The boot script a VM runs: install the pinned agent unless that version is
    already there (a prebuilt image), store the single-use bootstrap token in a
    0600 file, run the agent under systemd. Providers embed it as user data /
    startup-script / custom data.

    Two variables that no cloud sets let a test run this very script on a machine
    that is not a VM (tests/e2e/cloud_vm.py): RESPAWN_ROOT puts every file it
    writes under that directory instead of /, and RESPAWN_NO_SYSTEMD=1 execs the
    unit's command line in place of starting the unit."""
    q = shlex.quote
    argv = agent_argv(control_plane_url=control_plane_url, provider=provider)
    unit = render_agent_unit(control_plane_url=control_plane_url, provider=provider)
    installed = "python3 -c 'import importlib.metadata as m; print(m.version(\"respawn\"))' 2>/dev/null || true"
    w = shell_word
    return "\n".join(
        [
            "#!/bin/bash",
            "set -euo pipefail",
            "umask 077",
            'root="${RESPAWN_ROOT:-}"',
            f"install -d -m 700 {w(STATE_DIR)}",
            f"printf '%s' {q(bootstrap_token)} > {w(TOKEN_FILE)}",
            f'if [ "$({installed})" != {q(AGENT_VERSION)} ]; then',
            # A VM image's system Python is ours to install into (PEP 668 would refuse).
            f"  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet {q(agent_package)}",
            "fi",
            # systemd's PATH may lack pip's script dir (e.g. /opt/conda/bin): pin one path.
            f'agent=$(command -v respawn-agent); [ "$agent" = {w(AGENT_BIN)} ] || ln -sf "$agent" {w(AGENT_BIN)}',
            f"cat > {w(AGENT_UNIT)} <<'RESPAWN_UNIT'",
            unit + "RESPAWN_UNIT",
            f"chmod 644 {w(AGENT_UNIT)}",
            'if [ -n "${RESPAWN_NO_SYSTEMD:-}" ]; then',
            "  exec " + " ".join(w(arg) for arg in argv),
            "fi",
            "systemctl daemon-reload",
            "systemctl enable --now respawn-agent.service",
            "",
        ]
    )
