"""The agent's wheel, built from this checkout and served to VMs (DESIGN §11).

A VM never installs our name from a package index: anyone may publish a
`respawn` there. `build` makes the library distribution's wheel (`respawn-ml`,
agents/pyproject.toml, import `respawn`) as `pip wheel agents/` would, and a
requirements file pinning every package the agent imports, and their own
dependencies, to the versions installed beside this control plane (the VM installs
the wheel with --no-deps: those pins, not the wheel's ranges, are what it gets); `agent.json` names both with their SHA-256. Both are stored and
served under names made of their digest, and a rebuild leaves the earlier ones:
a VM launched before a redeploy and booting after it still finds the files its
user data pins. The worker pins
those digests in each VM's user data (providers.base.render_user_data), the agent
API serves the files to the VM's bootstrap or agent token
(respawn_server.jobs.api.agent.DistView), and the boot script checks both digests before it
installs anything.

Built with SOURCE_DATE_EPOCH fixed, so the same checkout gives the same wheel,
byte for byte, on every host that builds it (web replicas, a Docker build)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from django.conf import settings
from packaging.requirements import Requirement

import respawn

DIST_NAME = "respawn-ml"
MANIFEST = "agent.json"
SERVED = re.compile(r"respawn-agent-[0-9a-f]{64}\.(whl|requirements\.txt)")
# What the agent process imports beyond the standard library: its HTTP client, the
# manifest digest, and each cloud's storage SDK with its default credential chain.
# torch, numpy and safetensors belong to the training stack the machine or container
# image brings (a CUDA build matching its driver): pinning this host's would replace it.
AGENT_DEPENDENCIES = ("requests", "xxhash", "boto3", "google-cloud-storage", "azure-storage-blob", "azure-identity")
# 1980-01-01, the earliest time a zip entry can hold.
REPRODUCIBLE_EPOCH = "315532800"
PACKAGE_ROOT = Path(respawn.__file__).resolve().parent
# The library's source root (agents/): its pyproject.toml and README beside the package.
LIBRARY_ROOT = PACKAGE_ROOT.parent
LIBRARY_FILES = ("pyproject.toml", "README.md")


@dataclass(frozen=True)
class AgentDist:
    version: str
    wheel: str  # the wheel's own file name, which pip needs to install it
    wheel_sha256: str
    requirements_sha256: str

    @property
    def wheel_file(self) -> str:
        """The name the agent API serves the wheel under."""
        return served_name(self.wheel_sha256, "whl")

    @property
    def requirements_file(self) -> str:
        return served_name(self.requirements_sha256, "requirements.txt")


def served_name(sha256: str, suffix: str) -> str:
    return f"respawn-agent-{sha256}.{suffix}"


class NoAgentDist(Exception):
    """The control plane holds no agent wheel: VMs cannot be given their agent."""


def dist_dir() -> Path:
    return Path(settings.RESPAWN["AGENT_DIST_DIR"])


def current() -> AgentDist:
    """The wheel VMs get now, as `build` recorded it; NoAgentDist when there is none,
    or when it was built from another agent version than this control plane's."""
    try:
        dist = AgentDist(**json.loads((dist_dir() / MANIFEST).read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise NoAgentDist(f"no agent wheel in {dist_dir()} ({exc}); run `manage.py build_agent_wheel`") from None
    if dist.version != respawn.__version__:
        raise NoAgentDist(f"the agent wheel in {dist_dir()} is version {dist.version}, this control plane's agent "
                          f"is {respawn.__version__}; run `manage.py build_agent_wheel`")
    return dist


def served_file(name: str) -> Path | None:
    """A wheel or requirements file the agent API may serve (this or an earlier build),
    nothing else of the directory."""
    path = dist_dir() / name
    return path if SERVED.fullmatch(name) and path.is_file() else None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def pinned_requirements(roots=AGENT_DEPENDENCIES) -> list[str]:
    """`name==version` for each root and everything it needs, as installed here
    (markers evaluated for this interpreter, extras left out)."""
    pins: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = _canonical(todo.pop())
        if name in pins:
            continue
        dist = importlib.metadata.distribution(name)
        pins[name] = dist.version
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def build(out_dir: Path | None = None) -> AgentDist:
    """Build the wheel and its requirements into `out_dir` (the dist dir by default),
    then write the manifest last: a VM is only ever pinned to a complete pair."""
    out_dir = out_dir or dist_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    pins = pinned_requirements()
    missing = [name for name in LIBRARY_FILES if not (LIBRARY_ROOT / name).is_file()]
    if missing:
        raise NoAgentDist(f"{LIBRARY_ROOT} holds no {' or '.join(missing)}: the library's wheel is built from its "
                          f"source root (agents/ of a checkout, installed editable)")
    with tempfile.TemporaryDirectory(prefix="respawn-agent-build-") as tmp:
        # A copy: a build in place would leave build/ and *.egg-info in the source tree.
        staging = Path(tmp) / "src"
        shutil.copytree(PACKAGE_ROOT, staging / "respawn", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for name in LIBRARY_FILES:
            shutil.copyfile(LIBRARY_ROOT / name, staging / name)
        wheels = Path(tmp) / "wheels"
        env = {**os.environ, "SOURCE_DATE_EPOCH": REPRODUCIBLE_EPOCH, "PIP_NO_INPUT": "1"}
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                        "--no-index", "--wheel-dir", str(wheels), str(staging)], check=True, env=env)
        (built,) = wheels.glob("*.whl")
        if not built.name.startswith(f"{DIST_NAME.replace('-', '_')}-{respawn.__version__}-"):
            raise NoAgentDist(f"{LIBRARY_ROOT}/pyproject.toml built {built.name}, not {DIST_NAME} {respawn.__version__}")
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text("".join(f"{pin}\n" for pin in pins))
        dist = AgentDist(version=respawn.__version__, wheel=built.name, wheel_sha256=sha256_of(built),
                         requirements_sha256=sha256_of(requirements))
        shutil.copyfile(built, out_dir / dist.wheel_file)
        shutil.copyfile(requirements, out_dir / dist.requirements_file)
    manifest = out_dir / MANIFEST
    partial = manifest.with_suffix(".partial")
    partial.write_text(json.dumps(asdict(dist), indent=2) + "\n")
    partial.replace(manifest)
    return dist

