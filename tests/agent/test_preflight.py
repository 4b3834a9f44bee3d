"""`respawn-agent preflight` passes spot-safe scripts and says why another is not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"
pytestmark = pytest.mark.e2e  # four real training runs per case


def preflight(tmp_path, *command, steps=150):
    return subprocess.run(
        [sys.executable, "-m", "respawn.agent", "preflight", "--steps", str(steps), "--checkpoint-interval-s", "0.2", "--notice-budget-s", "20", "--run-timeout-s", "120", "--work-dir", str(tmp_path / "preflight"), "--", *command],
        capture_output=True, text=True, timeout=300,
    )


# The README's library loop and docs/data-loading.md's loop with loader workers (whose
# notice must reach the loop and not its workers) pass as printed in tests/docs/test_snippets.py.
@pytest.mark.parametrize(
    "command",
    [[sys.executable, "-m", "respawn.examples.plain_pytorch", "--step-delay-s", "0.005"]],
    ids=["plain_pytorch"],
)
def test_preflight_passes_on_the_examples(tmp_path, command):
    result = preflight(tmp_path, *command)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PREFLIGHT PASSED" in result.stdout


def test_preflight_fails_a_script_that_forgets_its_optimizer_state(tmp_path):
    result = preflight(tmp_path, sys.executable, str(SCRIPTS / "forgets_optimizer.py"), "--step-delay-s", "0.005")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "PREFLIGHT FAILED" in result.stdout
    assert "optimizer state" in result.stdout


def test_preflight_without_a_command_says_how_to_give_one(tmp_path):
    result = subprocess.run([sys.executable, "-m", "respawn.agent", "preflight"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "after `--`" in result.stdout
