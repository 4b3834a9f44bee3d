"""The one interface every cloud provider implements (AWS, GCP, Azure, local).

No Django here: providers take plain dataclasses in and give plain dataclasses
back, so they can be tested against emulators without a database and called
from Celery tasks that own all the state.
"""

from __future__ import annotations

import shlex
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Protocol

from respawn.agent import EXIT_INSTANCE_ENDED
from respawn_server.jobs.core.choices import Market

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
    storage_uri: str = ""  # the job's checkpoint prefix: the local provider prepares a local one for the VM's user
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
    # Refusals of what the control plane chose or built (the zone it placed a VM in, the
    # launch request), never of the user's credentials, quota or spec: the job's failure
    # is the controller's, and the user is not told to fix their job.
    OURS = frozenset({"InvalidZone", "InvalidRequest"})

    @property
    def ours(self) -> bool:
        return self.code in self.OURS


class TransientError(ProviderError):
    """Throttling, a 5xx, a timeout: retry the same call later."""

    kind = "transient"


class MissingPermission(PrecheckError):
    """The cloud refused the call for lack of a permission (AccessDenied, 403): `permission`
    names the one to grant, e.g. "fis:StartExperiment"."""

    def __init__(self, message: str, *, permission: str, code: str = ""):
        super().__init__(f"missing permission {permission}: {message}", code=code)
        self.permission = permission


class DrillUnsupported(PrecheckError):
    """This provider cannot interrupt a VM on purpose (or not this way)."""


class Provider(ABC):
    name: str
    # Whether a VM in CloudState.STOPPED still costs money (e.g. an Azure VM
    # deallocated by eviction keeps its disk): the ledger says so while it lasts.
    bills_storage_when_stopped: bool = False
    # The price SKU of that storage (a DiskPriceQuote's sku), recorded on each spot
    # instance at launch; empty when a stopped VM bills nothing.
    stopped_storage_sku: str = ""
    # Whether a VM boots the user data (a cloud's); the local provider starts the agent itself.
    boots_user_data: bool = True

    def agent_environment(self) -> dict[str, str]:
        """Variables the agent (and the trainer it starts) needs on this provider's VMs,
        e.g. which of the VM's identities the cloud SDKs' default credential chain takes."""
        return {}

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

    def interrupt(self, provider_instance_id: str, *, with_notice: bool) -> str:
        """Interrupt the VM on purpose through the cloud's own API, as a reclaim would (a
        drill, respawn_server.jobs.drills): with the cloud's own notice first, or without one (a hard
        reclaim). Returns what the cloud named the interruption (an experiment id, an
        operation), for the record. Raises MissingPermission when the cloud refuses it
        for lack of the (optional) permission, DrillUnsupported when this cloud cannot."""
        raise DrillUnsupported(f"the {self.name} provider cannot interrupt a VM on purpose", code="DrillUnsupported")

    def find_by_instance_id(self, instance_id: int) -> CloudInstance | None:
        for vm in self.list_ours():
            if vm.instance_id == instance_id and vm.state != CloudState.GONE:
                return vm
        return None


AGENT_UNIT = "/etc/systemd/system/respawn-agent.service"
AGENT_BIN = "/usr/local/bin/respawn-agent"
STATE_DIR = "/var/lib/respawn"
TOKEN_FILE = f"{STATE_DIR}/bootstrap-token"
WORK_DIR = f"{STATE_DIR}/work"
# Where the agent's wheel is installed (pip --target: apart from the image's own packages,
# whose torch it uses), and the SHA-256 of the wheel installed there: a prebuilt image
# with the pinned wheel's digest skips the download.
AGENT_LIB = "/opt/respawn/lib"
AGENT_MARKER = "/opt/respawn/agent-wheel.sha256"
# Paths the boot script writes: under $RESPAWN_ROOT when a test plays the VM, under / on a VM.
SYSTEM_PATHS = (AGENT_UNIT, AGENT_BIN, STATE_DIR, TOKEN_FILE, WORK_DIR, AGENT_LIB, AGENT_MARKER)
# The boot script's installer, run by the image's python3 before anything of ours can run.
# Its arguments: the control plane's URL, the token file, the wheel's name and SHA-256, the
# requirements' SHA-256, the install directory and the marker. A download refused or
# failing, a digest that differs, pip failing: each is reported with the bootstrap token
# (`POST setup-failed`: the job fails with cause setup and its VMs are terminated) and
# stops the boot, so no agent (and no training) starts from a wheel that is not ours.
AGENT_INSTALLER = r"""
import hashlib, json, os, subprocess, sys, tempfile, time, urllib.error, urllib.request, uuid
url, token_file, wheel, wheel_sha, req_sha, lib, marker = sys.argv[1:]
token = open(token_file).read()
api = url.rstrip("/") + "/api/agent/v1/"
if os.path.exists(marker) and open(marker).read().strip() == wheel_sha:
    print("respawn: the image holds the pinned agent wheel", wheel_sha)
    sys.exit(0)

def call(path, body=None, tries=8):
    request = urllib.request.Request(api + path, data=body and json.dumps(body).encode(),
                                     headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    for attempt in range(tries):
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return answer.read()
        except urllib.error.HTTPError as exc:
            if exc.code < 500 or attempt == tries - 1:
                raise
        except OSError:
            if attempt == tries - 1:
                raise
        time.sleep(min(2 ** attempt, 30))

def fail(message):
    print("respawn: agent setup failed:", message, file=sys.stderr)
    try:
        call("setup-failed", {"event_id": str(uuid.uuid4()), "message": message[:500]})
    except (OSError, urllib.error.HTTPError) as exc:
        print("respawn: could not report it:", exc, file=sys.stderr)
    sys.exit(1)

def fetch(name, sha, into):
    try:
        data = call("dist/respawn-agent-%s.%s" % (sha, name))
    except (OSError, urllib.error.HTTPError) as exc:
        fail("could not download the agent's %s from the control plane: %s" % (name, exc))
    got = hashlib.sha256(data).hexdigest()
    if got != sha:
        fail("the agent's %s from the control plane has SHA-256 %s, the user data pins %s: not installed"
             % (name, got, sha))
    with open(into, "wb") as f:
        f.write(data)

def pip(*args):
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-input", *args],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "PIP_BREAK_SYSTEM_PACKAGES": "1"})
    if done.returncode != 0:
        fail("pip install %s failed: %s" % (args[-1], done.stdout.strip()[-400:]))

tmp = tempfile.mkdtemp()
fetch("whl", wheel_sha, os.path.join(tmp, wheel))
fetch("requirements.txt", req_sha, os.path.join(tmp, "requirements.txt"))
# Dependencies: exact versions, binary wheels only (no setup.py runs), none of them ours.
pip("--only-binary=:all:", "-r", os.path.join(tmp, "requirements.txt"))
# The agent itself: from the checked file alone, never from an index.
pip("--no-index", "--no-deps", "--upgrade", "--target", lib, os.path.join(tmp, wheel))
with open(marker, "w") as f:
    f.write(wheel_sha + "\n")
print("respawn: installed the agent wheel", wheel_sha)
"""


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


def render_agent_unit(*, control_plane_url: str, provider: str, env: dict[str, str] | None = None) -> str:
    """The systemd unit that keeps the agent running: restarted when it fails (it
    resumes its session: respawn.agent.session), a bounded number of times so a
    broken agent does not spin forever, and not once its instance has ended."""
    argv = agent_argv(control_plane_url=control_plane_url, provider=provider)
    environment = [f"Environment={systemd_quote(f'{name}={value}')}" for name, value in (env or {}).items()]
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
            *environment,
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


class AgentWheel(Protocol):
    """The agent's wheel VMs install, as respawn_server.jobs.fleet.agent_dist.AgentDist records it."""

    wheel: str  # the wheel's file name
    wheel_sha256: str
    requirements_sha256: str


def render_user_data(*, control_plane_url: str, bootstrap_token: str, provider: str, agent: AgentWheel,
                     agent_env: dict[str, str] | None = None) -> str:
    """The boot script a VM runs: store the single-use bootstrap token in a 0600 file,
    install the agent's wheel the control plane built (`agent`: fetched on the agent
    API, its SHA-256 and its requirements' checked, unless the image holds that very
    wheel: AGENT_INSTALLER), run the agent under systemd with `agent_env` (what the
    provider's VM identity needs, e.g. AZURE_CLIENT_ID). Providers embed it as user
    data / startup-script / custom data.

    Two variables that no cloud sets let a test run this very script on a machine
    that is not a VM (tests/e2e/cloud_vm.py): RESPAWN_ROOT puts every file it
    writes under that directory instead of /, and RESPAWN_NO_SYSTEMD=1 execs the
    unit's command line in place of starting the unit."""
    q = shlex.quote
    argv = agent_argv(control_plane_url=control_plane_url, provider=provider)
    unit = render_agent_unit(control_plane_url=control_plane_url, provider=provider, env=agent_env or {})
    w = shell_word
    installer_args = [control_plane_url, TOKEN_FILE, agent.wheel, agent.wheel_sha256, agent.requirements_sha256,
                      AGENT_LIB, AGENT_MARKER]
    return "\n".join(
        [
            "#!/bin/bash",
            "set -euo pipefail",
            "umask 077",
            'root="${RESPAWN_ROOT:-}"',
            f"install -d -m 700 {w(STATE_DIR)}",
            f"install -d -m 755 {w(AGENT_LIB)}",
            f"printf '%s' {q(bootstrap_token)} > {w(TOKEN_FILE)}",
            "python3 - " + " ".join(w(arg) for arg in installer_args) + " <<'RESPAWN_INSTALLER'",
            AGENT_INSTALLER.strip(),
            "RESPAWN_INSTALLER",
            # systemd's PATH may lack the image's python3 (e.g. /opt/conda/bin): pin its path.
            'py=$(command -v python3)',
            f"printf '#!/bin/bash\\nexport PYTHONPATH=%q${{PYTHONPATH:+:$PYTHONPATH}}\\nexec %q -m respawn.agent \"$@\"\\n' "
            f'{w(AGENT_LIB)} "$py" > {w(AGENT_BIN)}',
            f"chmod 755 {w(AGENT_BIN)}",
            f"cat > {w(AGENT_UNIT)} <<'RESPAWN_UNIT'",
            unit + "RESPAWN_UNIT",
            f"chmod 644 {w(AGENT_UNIT)}",
            'if [ -n "${RESPAWN_NO_SYSTEMD:-}" ]; then',
            *(f"  export {name}={q(value)}" for name, value in (agent_env or {}).items()),
            "  exec " + " ".join(w(arg) for arg in argv),
            "fi",
            "systemctl daemon-reload",
            "systemctl enable --now respawn-agent.service",
            "",
        ]
    )
