"""Accelerate's save_state/load_state under Respawn's protocol (SpotSafeState): real
processes, real signals (issue 18 item 3, Accelerate)."""

from __future__ import annotations

import json
import signal

import pytest

pytest.importorskip("accelerate")

from .trials import kill_mid_save, newest_committed, reports, run, start, wait_for  # noqa: E402

MODULE = "agents.examples.accelerate_loop"
ARGS = ("--steps", "30", "--every-steps", "5")
# Bitwise equal after a resume; random_states_0.pkl is not compared: it holds the loader
# generator's state, which the resumed run's fresh iterator (skip_first_batches) advanced
# differently, and state.json names its own checkpoint id.
COMPARED = ("model.safetensors", "optimizer.bin", "scheduler.bin")


def digests(uri, step: int) -> dict:
    files = json.loads((uri / f"step-{step:08d}" / "MANIFEST.json").read_text())["files"]
    return {name: files[name]["digest"] for name in COMPARED}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    uri = tmp_path_factory.mktemp("accelerate") / "uninterrupted"
    code, out = run(MODULE, uri, *ARGS)
    assert code == 0, out
    return digests(uri, 30)


def test_notice_saves_stops_and_resumes_bitwise(uninterrupted, tmp_path):
    uri, channel = tmp_path / "ckpt", tmp_path / "channel"
    proc = start(MODULE, uri, *ARGS, "--step-delay", "0.1", channel=channel)
    wait_for(lambda: newest_committed(uri), proc, "a first commit", poll_s=0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "finished" not in out, out
    stopped_at = [r["step"] for r in reports(channel) if r["kind"] == "notice"]
    assert len(stopped_at) == 1 and 5 <= stopped_at[0] < 30
    assert json.loads((channel / "status.json").read_text())["stopped"] is True
    code, out = run(MODULE, uri, *ARGS)
    assert code == 0, out
    assert f"resumed at step {stopped_at[0]} from" in out
    assert digests(uri, 30) == uninterrupted


def test_sigkill_mid_save_resumes_from_the_previous_commit(uninterrupted, tmp_path):
    uri = tmp_path / "ckpt"
    torn, previous = kill_mid_save(MODULE, uri, *ARGS, "--step-delay", "0.02")
    assert previous is not None and previous < torn
    code, out = run(MODULE, uri, *ARGS)
    assert code == 0, out
    assert f"resumed at step {previous} from" in out
    assert digests(uri, 30) == uninterrupted


def test_a_torch_checkpoint_is_refused_and_kept(tmp_path):
    uri = tmp_path / "ckpt"
    assert run("agents.examples.tiny", uri, "--steps", "3")[0] == 0
    before = sorted(p.relative_to(uri) for p in uri.rglob("*"))
    code, out = run(MODULE, uri, *ARGS)
    assert code != 0
    assert "was written by a PyTorch loop with Checkpointer (torch)" in out and "nothing was deleted" in out
    assert sorted(p.relative_to(uri) for p in uri.rglob("*")) == before
