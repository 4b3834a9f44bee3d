"""Hugging Face Trainer with `spot_safe(trainer)`: real processes, real signals (issue 18 item 3)."""

from __future__ import annotations

import json
import signal

import pytest

pytest.importorskip("transformers")

from agents.checkpoint import CheckpointConfig, Checkpointer, TrainState  # noqa: E402
from agents.examples import hf_trainer  # noqa: E402

from .trials import differing, final_state, kill_mid_save, newest_committed, reports, run, start, wait_for  # noqa: E402

MODULE = "agents.examples.hf_trainer"
STEPS = 40


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    uri = tmp_path_factory.mktemp("hf") / "uninterrupted"
    code, out = run(MODULE, uri, "--steps", str(STEPS), "--every-steps", "10")
    assert code == 0, out
    return final_state(uri, STEPS)


def test_notice_saves_at_a_step_boundary_stops_and_resumes_bitwise(tmp_path, uninterrupted):
    uri, channel = tmp_path / "ckpt", tmp_path / "channel"
    proc = start(MODULE, uri, "--steps", str(STEPS), "--every-steps", "10", "--step-delay", "0.1", channel=channel)
    wait_for(lambda: newest_committed(uri), proc, "a first periodic commit", poll_s=0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert "finished" not in out  # train() did not return into the rest of the script
    notice = [r for r in reports(channel) if r["kind"] == "notice"]
    assert len(notice) == 1, reports(channel)
    stopped_at = notice[0]["step"]
    assert 10 <= stopped_at < STEPS
    assert json.loads((channel / "status.json").read_text())["stopped"] is True
    # The notice checkpoint is the state at an optimizer step boundary: Trainer's own
    # global_step there is the step it is named by.
    saved = final_state(uri, stopped_at)
    assert json.loads(saved["extra"]["trainer_state"])["global_step"] == stopped_at
    code, out = run(MODULE, uri, "--steps", str(STEPS), "--every-steps", "10")
    assert code == 0, out
    assert f"resumed at step {stopped_at} from" in out
    resumed = final_state(uri, STEPS)
    for part in ("model", "optimizer", "scheduler"):
        assert differing(resumed[part], uninterrupted[part]) == [], part


def test_sigkill_mid_save_resumes_from_the_previous_commit(tmp_path):
    args = ("--steps", "30", "--every-steps", "4", "--n-embd", "192", "--step-delay", "0.05")
    reference = tmp_path / "reference"
    assert run(MODULE, reference, *args[:-2])[0] == 0
    uri = tmp_path / "ckpt"
    torn, previous = kill_mid_save(MODULE, uri, *args)
    assert previous is not None and previous < torn
    code, out = run(MODULE, uri, *args)
    assert code == 0, out
    assert f"resumed at step {previous} from" in out
    assert not (uri / f"step-{torn:08d}").exists() or (uri / f"step-{torn:08d}" / "MANIFEST.json").exists()
    assert differing(final_state(uri, 30)["model"], final_state(reference, 30)["model"]) == []


def test_another_frameworks_checkpoint_is_refused_and_kept(tmp_path):
    uri = tmp_path / "ckpt"
    other = Checkpointer(TrainState(hf_trainer.make_model()), CheckpointConfig(uri=str(uri), handle_signals=False),
                         framework="lightning")
    other.save(5, kind="final")
    other.close()
    before = sorted(p.relative_to(uri) for p in uri.rglob("*"))
    code, out = run(MODULE, uri, "--steps", "10")
    assert code != 0
    assert "was written by the Lightning integration (lightning)" in out and "nothing was deleted" in out
    assert sorted(p.relative_to(uri) for p in uri.rglob("*")) == before
