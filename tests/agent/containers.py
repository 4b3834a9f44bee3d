"""A real container runtime for the tests: Debian's podman, with images built here
from a root filesystem (busybox-static), never pulled: no registry is reachable.

This sandbox needs two settings podman takes from its own configuration file
(CONTAINERS_CONF): runc as the OCI runtime (crun fails on its hybrid cgroups) and
rlimits within what the sandbox may set. A VM needs neither."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

IMAGE = "localhost/respawn-test-busybox:1"
BUSYBOX_TOOLS = ("sh", "sleep", "echo", "cat", "pwd", "env", "printf", "test", "touch")
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
runtime = "runc"
"""


def podman_env(tmp: Path) -> dict[str, str]:
    conf = tmp / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def build_busybox_image(tmp: Path, env: dict[str, str]) -> str:
    """IMAGE from a root filesystem holding only busybox (`podman import`, no registry)."""
    busybox = shutil.which("busybox")
    assert busybox, "busybox is missing: apt-get install busybox-static"
    rootfs = tmp / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    shutil.copy2(busybox, rootfs / "bin" / "busybox")
    for tool in BUSYBOX_TOOLS:
        (rootfs / "bin" / tool).symlink_to("busybox")
    (rootfs / "tmp").mkdir()
    tarball = tmp / "rootfs.tar"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tarball), "."], check=True)
    subprocess.run(["podman", "import", "--quiet", str(tarball), IMAGE], env=env, check=True, capture_output=True,
                   timeout=300)
    return IMAGE


@pytest.fixture(scope="session")
def podman(tmp_path_factory) -> dict[str, str]:
    """The environment a process needs to run podman here, with IMAGE built."""
    assert shutil.which("podman"), "podman is missing: apt-get install podman runc catatonit busybox-static"
    tmp = tmp_path_factory.mktemp("podman")
    env = podman_env(tmp)
    build_busybox_image(tmp, env)
    return env
