"""An unsupported framework release is refused by name (issue 18, bad input): each
integration checks the installed distribution's version before it imports the framework,
against the same bounds as the library's extras (agents/pyproject.toml)."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from respawn.integrations._common import SUPPORTED

ROOT = Path(__file__).resolve().parents[2]
# What importing each integration, or making its object, asks of the framework.
IMPORTS = {
    "transformers": "import respawn.integrations.hf",
    "lightning": "import respawn.integrations.lightning",
    "orbax-checkpoint": "import respawn.integrations.jax",
    "accelerate": "from respawn.integrations.accelerate import SpotSafeState; SpotSafeState(None)",
}


def test_the_supported_releases_are_those_the_extras_install():
    extras = tomllib.loads((ROOT / "agents" / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for distribution, (at_least, below, extra) in SUPPORTED.items():
        wanted = next(r for r in extras[extra] if re.match(rf"{re.escape(distribution)}\b(?!-)", r))
        assert wanted.replace(" ", "") == f"{distribution}>={at_least},<{below}", (extra, wanted)


@pytest.mark.parametrize("distribution", sorted(IMPORTS))
def test_an_older_release_than_supported_is_refused_naming_it(distribution, tmp_path):
    # A real distribution's metadata, older than supported, found first on the path: what an
    # environment with that release installed shows importlib.metadata.
    name = distribution.replace("-", "_")
    info = tmp_path / f"{name}-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1.0\n")
    done = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r}); "
                                                 f"{IMPORTS[distribution]}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    at_least, below, extra = SUPPORTED[distribution]
    assert (f"ConfigError: {distribution} 0.1.0 is not supported by respawn.integrations (it is built and tested "
            f"for {distribution}>={at_least},<{below})") in done.stderr, done.stderr[-2000:]
    assert f"pip install 'respawn-ml[{extra}]'" in done.stderr
