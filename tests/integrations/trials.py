"""Kill/resume trials on a framework example run as a real process (tests/integrations)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from respawn.checkpoint import layout
from respawn.checkpoint.reader import committed, load, ref_from_uri
from respawn.checkpoint.storage.local import LocalStorage

ROOT = Path(__file__).resolve().parents[2]


def standalone_env(keep_env: tuple[str, ...] = ()) -> dict[str, str]:
    """A training script's environment outside the agent: none of its RESPAWN_ variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPAWN_") or k in keep_env}
    env["PYTHONPATH"] = str(ROOT)
    return env


def start(module: str, uri: Path, *args: str, channel: Path | None = None, keep_env: tuple[str, ...] = ()) -> subprocess.Popen:
    env = standalone_env(keep_env)
    if channel is not None:
        channel.mkdir(exist_ok=True)
        env["RESPAWN_STATUS_FILE"] = str(channel / "status.json")
        env["RESPAWN_CHECKPOINTS_FILE"] = str(channel / "checkpoints.jsonl")
    return subprocess.Popen([sys.executable, "-m", module, "--uri", str(uri), *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run(module: str, uri: Path, *args: str, channel: Path | None = None, keep_env: tuple[str, ...] = ()) -> tuple[int, str]:
    proc = start(module, uri, *args, channel=channel, keep_env=keep_env)
    out, _ = proc.communicate(timeout=600)
    return proc.returncode, out


def wait_for(predicate, proc: subprocess.Popen, what: str, timeout_s: float = 300.0, poll_s: float = 0.002):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}: {proc.communicate()[0][-3000:]}")
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}")


def newest_committed(uri: Path) -> int | None:
    refs = committed(LocalStorage(str(uri)))
    return refs[-1].step if refs else None


def torn_step(uri: Path, after: int | None) -> int | None:
    """A step directory newer than the newest committed one and without a manifest yet."""
    if not uri.exists():
        return None
    for d in uri.iterdir():
        step = layout.parse_step_dir(d.name)
        if step is not None and (after is None or step > after) and not (d / layout.MANIFEST).exists():
            return step
    return None


def kill_mid_save(module: str, uri: Path, *args: str) -> tuple[int, int]:
    """SIGKILL the run while a periodic save is being written (its directory has data
    but no manifest); returns (the torn step, the newest committed step at the kill)."""
    proc = start(module, uri, *args)
    try:
        wait_for(lambda: newest_committed(uri), proc, "a first commit")
        torn = wait_for(lambda: torn_step(uri, newest_committed(uri)), proc, "a save in flight")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return torn, newest_committed(uri)


def preflight(framework: str, work_dir: Path, *script_args: str) -> subprocess.CompletedProcess:
    """`respawn-agent preflight --framework <framework> -- <script_args>`: its four runs."""
    return subprocess.run(
        [sys.executable, "-m", "respawn.agent", "preflight", "--checkpoint-interval-s", "0.2", "--notice-budget-s", "20",
         "--run-timeout-s", "200", "--framework", framework, "--work-dir", str(work_dir), "--", *script_args],
        cwd=ROOT, capture_output=True, text=True, timeout=600)


def reference_run_finished(work_dir: Path, steps: int) -> bool:
    """Whether the reference run of a preflight kept in `work_dir` committed its last step."""
    return (work_dir / "ckpt-reference" / layout.step_dir(steps)).exists()


def final_state(uri: Path, step: int) -> dict:
    return load(ref_from_uri(f"{uri}/{layout.step_dir(step)}")).state


def differing(a, b, where: str = "") -> list[str]:
    """Paths of the tensors (and other values) in which two states differ, bitwise."""
    import torch

    if isinstance(a, torch.Tensor):
        return [] if a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b) else [where]
    if isinstance(a, dict):
        keys = set(a) | set(b)
        return [p for k in sorted(keys, key=str) for p in (differing(a.get(k), b.get(k), f"{where}/{k}")
                                                           if k in a and k in b else [f"{where}/{k}"])]
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return [where]
        return [p for i, (x, y) in enumerate(zip(a, b)) for p in differing(x, y, f"{where}/{i}")]
    return [] if a == b else [where]


def reports(channel: Path) -> list[dict]:
    path = channel / "checkpoints.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
