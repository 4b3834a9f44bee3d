"""Crash trials: train `tiny` in a forked child, kill it at a random moment, resume,
and check what a user would check.

Each trial proves two things:
- no torn checkpoint is ever loadable: right after the kill, every checkpoint
  directory that has a manifest passes full verification, and the resumed run
  starts from a checkpoint that passes validation;
- exact resume: the resumed run ends with model and optimizer state bitwise equal
  to an uninterrupted run's;
and counts what the kill left on disk that the resumed run did not clean up (torn
directories, temp files): it should be nothing.

Trials fork from a process that has already imported torch, so one costs about
a training run, not an interpreter start. Used by bench/crash.py (hundreds of
trials) and the test suite (a few dozen).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from respawn.checkpoint import CheckpointConfig
from respawn.checkpoint import layout, manifest
from respawn.checkpoint.reader import CheckpointRef, committed, load
from respawn.checkpoint.storage.local import TMP_MARKER, LocalStorage
from respawn.examples import tiny

STEPS = 200
EVERY_STEPS = 10


def trial_config(uri: str) -> CheckpointConfig:
    return CheckpointConfig(uri=uri, every_steps=EVERY_STEPS, num_files=2, validation=tiny.VALIDATION)


def _in_child(work: Callable[[], int]) -> int:
    """Run `work` in a forked child; return its pid."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            torch.set_num_threads(1)
            # A SIGTERM landing after the run closed its Checkpointer (handlers restored)
            # must not count as a crash of the trial: the run is over by then.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            code = work()
        except BaseException as exc:  # the parent only sees the exit status
            print(f"crash trial child failed: {type(exc).__name__}: {exc}", flush=True)
        finally:
            os._exit(code)
    return pid


def _wait(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def run_to_end(uri: str) -> int:
    """Fork a run that resumes (if it can) and trains to STEPS; wait for it."""
    return _wait(_in_child(lambda: (tiny.train(trial_config(uri), STEPS), 0)[1]))


def final_state(uri: str) -> dict[str, bytes]:
    """Model and optimizer tensors of the final checkpoint, as raw bytes by name."""
    state = load(CheckpointRef(LocalStorage(uri), layout.step_dir(STEPS))).state
    flat: dict[str, bytes] = {}

    def walk(prefix: str, obj) -> None:
        if isinstance(obj, torch.Tensor):
            flat[prefix] = str(obj.dtype).encode() + bytes(obj.contiguous().view(-1).view(torch.uint8).numpy())
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}.{k}", v)
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(f"{prefix}[{i}]", v)
        else:
            flat[prefix] = repr(obj).encode()

    walk("model", state["model"])
    walk("optimizer", state["optimizer"])
    return flat


@dataclass
class TrialResult:
    mode: str
    committed_after_kill: int  # checkpoints that verified right after the kill
    torn_after_kill: int  # directories without a manifest (a persist was cut)
    identical: bool
    problem: str = ""
    left_after_resume: int = 0  # leftovers (see `leftovers`) once the resumed run ended


def leftovers(uri: str) -> list[str]:
    """What the disk keeps besides committed checkpoints: step directories without a
    manifest, and temp files of writes that never finished."""
    root = Path(uri)
    torn = [d.name for d in root.glob("step-*") if not (d / layout.MANIFEST).exists()]
    return sorted(torn + [str(p.relative_to(root)) for p in root.rglob(f"*{TMP_MARKER}*")])


def _writing_data_file(uri: str) -> bool:
    """Whether a persist is writing a data file now. The run's rotation may remove a step
    directory while it is being listed: Python 3.11's glob lets that FileNotFoundError out."""
    try:
        return any(TMP_MARKER in p.name for p in Path(uri).glob("step-*/*"))
    except FileNotFoundError:
        return False


def _kill_when(pid: int, uri: str, mode: str, rng: random.Random) -> None:
    """Deliver the trial's signal: at a random moment, or while a persist is writing."""
    if mode == "mid-persist":
        time.sleep(rng.uniform(0, 0.8))  # then the next persist that is writing, whichever it is
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if _writing_data_file(uri):
                time.sleep(rng.uniform(0, 0.02))
                break
            time.sleep(0.001)
        os.kill(pid, signal.SIGKILL)
    else:
        time.sleep(rng.uniform(0.05, 1.5))
        os.kill(pid, signal.SIGTERM if mode == "sigterm" else signal.SIGKILL)


def run_trial(workdir: str, mode: str, reference: dict[str, bytes], rng: random.Random) -> TrialResult:
    """mode: "random" (SIGKILL at a random moment), "mid-persist" (SIGKILL while a
    data file is being written) or "sigterm" (notice save, clean stop)."""
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    pid = _in_child(lambda: (tiny.train(trial_config(workdir), STEPS), 0)[1])
    _kill_when(pid, workdir, mode, rng)
    code = _wait(pid)
    if mode == "sigterm" and code != 0:
        return TrialResult(mode, 0, 0, False, f"SIGTERM run exited {code} instead of stopping cleanly")
    storage = LocalStorage(workdir)
    names = {p.name for p in Path(workdir).glob("step-*") if any(p.iterdir())}
    good = 0
    for ref in committed(storage):
        try:
            manifest.verify_all(storage, ref.name)
            good += 1
        except Exception as exc:  # any failure here is exactly what the trial looks for
            return TrialResult(mode, good, 0, False, f"committed checkpoint {ref.name} fails verification: {exc}")
    torn = len(names) - good
    if run_to_end(workdir) != 0:
        return TrialResult(mode, good, torn, False, "resumed run failed")
    identical = final_state(workdir) == reference
    left = leftovers(workdir)
    problem = "" if identical else "final state differs from the uninterrupted run"
    if left:
        problem = "; ".join(filter(None, [problem, f"left on disk after the resumed run: {', '.join(left)}"]))
    return TrialResult(mode, good, torn, identical, problem, len(left))


def reference_state(workdir: str) -> dict[str, bytes]:
    shutil.rmtree(workdir, ignore_errors=True)
    if run_to_end(workdir) != 0:
        raise RuntimeError("the uninterrupted reference run failed")
    return final_state(workdir)


def run_trials(n: int, workdir: str, seed: int = 0, modes=("random", "mid-persist", "sigterm"),
               on_result: Callable[[int, TrialResult], None] | None = None) -> list[TrialResult]:
    rng = random.Random(seed)
    torch.use_deterministic_algorithms(True)  # once here, not in every forked child (it imports a lot)
    reference = reference_state(os.path.join(workdir, "reference"))
    results = []
    for i in range(n):
        result = run_trial(os.path.join(workdir, "trial"), modes[i % len(modes)], reference, rng)
        results.append(result)
        if on_result:
            on_result(i, result)
    return results
