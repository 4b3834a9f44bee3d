"""Secrets come from the environment or files, never from the repository: nothing
committed holds a key or token, and the laptop's generated key stays private.
(A key from DJANGO_SECRET_KEY_FILE and `check --deploy` are in tests/test_settings.py.)"""

from __future__ import annotations

import re
import stat
import subprocess
import sys

from tests.conftest import ROOT
from tests.security.leaks import TOKEN_SHAPE

SECRET_SHAPES = {
    "one of our tokens": TOKEN_SHAPE,
    "an AWS access key id": re.compile(r"AKIA[0-9A-Z]{16}"),
    "a private key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    "a Django secret key": re.compile(r"""SECRET_KEY\s*=\s*["'][^"']{20,}["']"""),
}


def test_no_committed_file_holds_a_secret():
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    found = []
    for name in filter(None, files.decode().split("\0")):
        path = ROOT / name
        if not path.is_file():
            continue  # deleted in the working tree
        text = path.read_bytes().decode("utf-8", "replace")
        found += [f"{name}: {what}" for what, shape in SECRET_SHAPES.items() if shape.search(text)]
    assert found == []


def secret_key(var_dir, **variables) -> str:
    """SECRET_KEY as a fresh process with only these variables set sees it."""
    env = {"PATH": "/usr/bin:/bin", "RESPAWN_VAR_DIR": str(var_dir), "DJANGO_SETTINGS_MODULE": "respawn_server.settings",
           **variables}
    code = "import django; django.setup(); from django.conf import settings; print(settings.SECRET_KEY)"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_generated_laptop_key_is_private_ignored_by_git_and_kept_across_restarts(tmp_path):
    first = secret_key(tmp_path)
    assert len(first) >= 50 and secret_key(tmp_path) == first
    assert stat.S_IMODE((tmp_path / "secret_key").stat().st_mode) == 0o600
    ignored = subprocess.run(["git", "check-ignore", "-q", "var/secret_key"], cwd=ROOT)
    assert ignored.returncode == 0, "var/ (where the laptop key lives) must stay out of git"


def test_the_key_from_the_environment_wins_and_is_never_written_to_disk(tmp_path):
    assert secret_key(tmp_path, DJANGO_SECRET_KEY="k" * 60) == "k" * 60
    assert not (tmp_path / "secret_key").exists()
