"""The README's training loop, copied out of README.md as a user would and run for real:
it checkpoints at the interval it is given, stops cleanly on SIGTERM with a committed
notice checkpoint, resumes from it and finishes. A README edit that breaks the loop
fails here."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from respawn.checkpoint import layout

from .conftest import ROOT_DIR

SECTION = "### Making a training script spot-safe"
WAIT_S = 120


def readme_loop() -> str:
    readme = (ROOT_DIR / "README.md").read_text()
    match = re.search(re.escape(SECTION) + r"\n.*?```python\n(.*?)```", readme, re.DOTALL)
    assert match, f"README.md has no python block under {SECTION!r}"
    return match.group(1)


def start(script: Path, total_steps: int, interval_s: float) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPAWN_")} | {
        "PYTHONPATH": str(ROOT_DIR),
        "RESPAWN_TOTAL_STEPS": str(total_steps),
        "RESPAWN_CHECKPOINT_INTERVAL_S": str(interval_s),
    }
    return subprocess.Popen([sys.executable, str(script)], cwd=script.parent, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(process: subprocess.Popen) -> str:
    out, err = process.communicate(timeout=WAIT_S)
    assert process.returncode == 0, f"exit {process.returncode}: {err[-3000:]}"
    return out


def kind_of(checkpoint: Path) -> str:
    return json.loads((checkpoint / layout.STATE).read_text())["kind"]


def test_the_readme_loop_checkpoints_stops_on_sigterm_resumes_and_finishes(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(readme_loop())
    root = tmp_path / "checkpoints"  # the loop's default storage, beside the script

    run = start(script, total_steps=10**9, interval_s=0.5)
    deadline = time.monotonic() + WAIT_S
    while not (root / layout.LATEST).exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (root / layout.LATEST).exists(), f"no periodic checkpoint within {WAIT_S} s: {run.communicate()[1][-3000:]}"
    first = root / (root / layout.LATEST).read_text()
    assert kind_of(first) == "periodic"
    run.send_signal(signal.SIGTERM)  # a preemption notice
    out = finished(run)
    assert out.startswith("no checkpoint to resume from: starting at step 0")
    stopped = root / (root / layout.LATEST).read_text()
    assert kind_of(stopped) == "notice" and (stopped / layout.MANIFEST).exists()
    stopped_step = layout.parse_step_dir(stopped.name)

    out = finished(start(script, total_steps=stopped_step + 50, interval_s=600))

    assert out.startswith(f"resumed at step {stopped_step} from checkpoints/{stopped.name}")
    final = root / layout.step_dir(stopped_step + 50)
    assert (root / layout.LATEST).read_text() == final.name
    assert kind_of(final) == "final" and (final / layout.MANIFEST).exists()
