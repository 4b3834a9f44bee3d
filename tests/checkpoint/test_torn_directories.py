"""Torn checkpoint directories: a real training process killed with SIGKILL mid-save
or mid-rotation leaves a step directory without a manifest; the next start or commit
deletes it, and never a directory a live writer is still filling."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from respawn.checkpoint import Checkpointer, layout, manifest
from respawn.checkpoint.reader import committed
from respawn.checkpoint.storage.local import TMP_MARKER, LocalStorage
from respawn.examples import tiny
from respawn.examples.crash_trials import leftovers

from .conftest import ROOT_DIR, config

# Wide enough (about 50 MB of state) that a paced persist keeps its data files
# temporary for tens of milliseconds: the kill must land while nothing is renamed yet.
WIDE_HIDDEN = 2048
WAIT_S = 120


def tiny_run(root: Path, steps: int, every_steps: int, step_delay: float = 0.0, prelude: str = "") -> subprocess.Popen:
    """`python -m respawn.examples.tiny` as a user runs it, after `prelude` (Python)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPAWN_")} | {"TINY_HIDDEN": str(WIDE_HIDDEN)}
    argv = ["--uri", str(root), "--steps", str(steps), "--every-steps", str(every_steps), "--step-delay", str(step_delay)]
    code = f"{prelude}\nimport sys\nfrom respawn.examples import tiny\nsys.exit(tiny.main({argv!r}))"
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT_DIR, env=env, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen) -> str:
    _, err = process.communicate(timeout=WAIT_S)
    assert process.returncode == 0, err[-2000:]
    return err


def temp_only_dir_after_a_commit(root: Path, process: subprocess.Popen) -> Path:
    """A step directory newer than the committed ones that holds nothing but temp files
    (a persist writing it): the state a kill there leaves, invisible to a listing."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and process.poll() is None:
        latest = root / layout.LATEST
        newest = latest.read_text() if latest.exists() else None
        for directory in sorted(root.glob("step-*")):
            try:
                names = [p.name for p in directory.iterdir()]
            except FileNotFoundError:  # rotated away while we looked
                continue
            if newest and directory.name > newest and names and all(TMP_MARKER in n for n in names):
                return directory
        time.sleep(0.001)
    process.kill()
    pytest.fail(f"no persist was seen writing after a commit (exit {process.wait()}): {process.stderr.read()[-2000:]}")


def test_a_save_killed_while_its_files_are_temporary_is_deleted_once_a_newer_checkpoint_commits(tmp_path):
    root = tmp_path / "ckpt"
    run = tiny_run(root, 100_000, every_steps=10, step_delay=0.02)
    torn = temp_only_dir_after_a_commit(root, run)
    run.send_signal(signal.SIGKILL)
    run.communicate(timeout=WAIT_S)
    temp_files = list(torn.iterdir())
    assert temp_files, "the kill landed after the persist finished"
    torn_step = layout.parse_step_dir(torn.name)

    # The restart trains one step past the torn save and commits only its final checkpoint.
    err = finish(tiny_run(root, torn_step + 1, every_steps=1000))

    # On start it was newer than every committed checkpoint (a live writer's, for all it knew)...
    assert f"skipping {root}/{torn.name}: not committed" in err
    # ...and once a newer checkpoint committed, it went, with its bytes.
    assert not torn.exists()
    assert leftovers(str(root)) == []
    assert [ref.step for ref in committed(LocalStorage(str(root)))][-1] == torn_step + 1


def dies_in(cls: str, method: str, when: str, before: bool) -> str:
    """A prelude patching `cls.method` (cls a dotted path) so that the process SIGKILLs
    itself there when `when` (an expression over `self` and `args`, read on entry)
    holds: before the real call, or right after it."""
    module, name = cls.rsplit(".", 1)
    return f"""
import os, signal
from {module} import {name}
real = {name}.{method}
def dying(self, *args):
    due = {when}
    if due and {before}:
        os.kill(os.getpid(), signal.SIGKILL)
    result = real(self, *args)
    if due:
        os.kill(os.getpid(), signal.SIGKILL)
    return result
{name}.{method} = dying
"""


# Dies the moment rotation has deleted an old checkpoint's manifest (only rotation deletes
# a manifest that exists): the directory is left half-deleted, as a preemption there would.
DIE_IN_ROTATION = dies_in("respawn.checkpoint.storage.local.LocalStorage", "delete_prefix",
                          'args[0].endswith("/MANIFEST.json") and self.exists(args[0])', before=False)


def killed_in_a_run(root: Path, prelude: str, steps: int = 30) -> None:
    run = tiny_run(root, steps, every_steps=10, prelude=prelude)
    run.communicate(timeout=WAIT_S)
    assert run.returncode == -signal.SIGKILL


def restarted_after_training_is_over(root: Path) -> None:
    """The restart only loads (and validates) the newest checkpoint, the run's last
    step, and finishes: no new commit sweeps."""
    finish(tiny_run(root, layout.parse_step_dir((root / layout.LATEST).read_text()), every_steps=10))
    assert leftovers(str(root)) == []


def test_a_directory_half_deleted_by_a_kill_in_the_last_commits_rotation_is_deleted_on_the_next_start(tmp_path):
    root = tmp_path / "ckpt"
    # Trains until a rotation deletes: on a loaded machine a periodic save is passed over
    # while the one before still persists, so 30 steps may commit only two checkpoints.
    killed_in_a_run(root, DIE_IN_ROTATION, steps=100_000)
    half_deleted = [d for d in root.glob("step-*") if not (d / layout.MANIFEST).exists()]
    assert len(half_deleted) == 1 and half_deleted[0].name < (root / layout.LATEST).read_text()

    restarted_after_training_is_over(root)
    assert not half_deleted[0].exists()


def test_a_live_writers_directory_survives_another_process_starting_and_its_save_commits(tmp_path, monkeypatch):
    root = tmp_path / "ckpt"
    monkeypatch.setattr(tiny, "HIDDEN", WIDE_HIDDEN)
    other = Checkpointer(tiny.build(), config(str(root), validation=None))
    # Slow steps: each persist is paced over about a second, longer than a start takes.
    run = tiny_run(root, 100_000, every_steps=10, step_delay=0.1)
    try:
        writing = temp_only_dir_after_a_commit(root, run)
        # A second process on the same root starts (an overlapping incarnation) and sweeps.
        other.load_latest()
        assert writing.exists()
        deadline = time.monotonic() + WAIT_S
        while not (writing / layout.MANIFEST).exists() and time.monotonic() < deadline and run.poll() is None:
            time.sleep(0.01)
        manifest.verify_all(LocalStorage(str(root)), writing.name)  # the live writer's save committed whole
    finally:
        run.kill()
        run.communicate(timeout=WAIT_S)


# Dies between writing a checkpoint's verdict and renaming it into place: the final
# checkpoint is committed, so no commit will sweep its folder again.
DIE_BEFORE_VERDICT_RENAME = dies_in("respawn.checkpoint.storage.local.LocalWriter", "close",
                                    f"self._final.name == {layout.VALIDATION!r}", before=True)


def test_a_verdict_killed_before_its_rename_leaves_no_temp_file_once_the_resumed_run_ends(tmp_path):
    root = tmp_path / "ckpt"
    killed_in_a_run(root, DIE_BEFORE_VERDICT_RENAME)
    final = root / layout.step_dir(30)
    assert [p.name for p in final.glob(f"{layout.VALIDATION}{TMP_MARKER}*")], "the kill left no verdict temp file"

    restarted_after_training_is_over(root)  # it validates and exports step 30 again
    assert (final / layout.VALIDATION).exists()
