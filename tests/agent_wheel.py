"""The agent's wheel as `manage.py build_agent_wheel` builds it, for tests that launch
cloud VMs: built once per content of `agents/` (about 7 s) into a directory shared by
test processes, then used as the control plane's dist dir (RESPAWN_AGENT_DIST_DIR)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from respawn_server.jobs.fleet import agent_dist

CACHE = Path(tempfile.gettempdir()) / "respawn-test-agent-dist"


def source_key() -> str:
    digest = hashlib.sha256("\n".join(agent_dist.pinned_requirements()).encode())
    files = sorted(agent_dist.PACKAGE_ROOT.rglob("*.py")) + [agent_dist.LIBRARY_ROOT / name for name in agent_dist.LIBRARY_FILES]
    for path in files:
        digest.update(str(path.relative_to(agent_dist.LIBRARY_ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def built_dist_dir() -> Path:
    """A dist dir holding the wheel of this checkout's `agents/` (built if no test process has yet)."""
    done = CACHE / source_key()
    if not (done / agent_dist.MANIFEST).exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=CACHE, prefix="building-"))
        agent_dist.build(staging)
        try:
            os.rename(staging, done)
        except OSError:  # another test process finished first: same bytes
            shutil.rmtree(staging, ignore_errors=True)
    return done


@pytest.fixture
def agent_wheel(settings) -> agent_dist.AgentDist:
    """The control plane of this test (and of its child processes) holds the agent's wheel."""
    settings.RESPAWN = {**settings.RESPAWN, "AGENT_DIST_DIR": str(built_dist_dir())}
    return agent_dist.current()
