"""HF Trainer and Lightning with one line added (`spot_safe(trainer)`): real processes,
real signals (issue 18 items 3 and 4).

Each framework's example is run uninterrupted, then stopped by SIGTERM (the agent's
notice) and resumed, then SIGKILLed while a save is being written and resumed: the
resumed runs end bitwise equal to the uninterrupted one on CPU (model, optimizer and
scheduler state). A checkpoint root holding another framework's checkpoint is refused,
with nothing deleted.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from dataclasses import dataclass

import pytest

from respawn.checkpoint import CheckpointConfig, Checkpointer, TrainState
from respawn.examples import tiny_lm

from .trials import (ROOT, differing, final_state, kill_mid_save, newest_committed, preflight, reference_run_finished,
                     reports, run, start, wait_for)

STEPS = 40


@dataclass(frozen=True)
class Framework:
    name: str
    module: str
    other: str  # another framework's name, for the refusal test
    other_says: str

    def step_of(self, state: dict) -> int:
        """The framework's own step counter in a checkpoint's saved state."""
        if self.name == "hf":
            return json.loads(state["extra"]["trainer_state"])["global_step"]
        return state["extra"]["lightning"]["global_step"]

    def scheduler(self, state: dict):
        return state["scheduler"] if self.name == "hf" else state["extra"]["lightning"]["lr_schedulers"]


FRAMEWORKS = {
    "hf": Framework("hf", "respawn.examples.hf_trainer", "lightning", "was written by the Lightning integration (lightning)"),
    "lightning": Framework("lightning", "respawn.examples.lightning_module", "hf",
                           "was written by the Hugging Face Trainer integration (hf)"),
}


@pytest.fixture(scope="module", params=sorted(FRAMEWORKS))
def framework(request):
    pytest.importorskip({"hf": "transformers", "lightning": "lightning"}[request.param])
    return FRAMEWORKS[request.param]


@pytest.fixture(scope="module")
def uninterrupted(framework, tmp_path_factory):
    uri = tmp_path_factory.mktemp(framework.name) / "uninterrupted"
    code, out = run(framework.module, uri, "--steps", str(STEPS), "--every-steps", "10")
    assert code == 0, out
    return final_state(uri, STEPS)


def test_notice_saves_at_a_step_boundary_stops_and_resumes_bitwise(framework, uninterrupted, tmp_path):
    uri, channel = tmp_path / "ckpt", tmp_path / "channel"
    args = ("--steps", str(STEPS), "--every-steps", "10")
    proc = start(framework.module, uri, *args, "--step-delay", "0.1", channel=channel)
    wait_for(lambda: newest_committed(uri), proc, "a first periodic commit", poll_s=0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert "finished" not in out  # the script did not carry on as after a finished run
    notice = [r for r in reports(channel) if r["kind"] == "notice"]
    assert len(notice) == 1, reports(channel)
    stopped_at = notice[0]["step"]
    assert 10 <= stopped_at < STEPS
    assert json.loads((channel / "status.json").read_text())["stopped"] is True
    # Saved at an optimizer step boundary: the framework's own step counter in the
    # checkpoint is the step it is named by.
    assert framework.step_of(final_state(uri, stopped_at)) == stopped_at
    code, out = run(framework.module, uri, *args)
    assert code == 0, out
    assert f"resumed at step {stopped_at} from" in out
    resumed = final_state(uri, STEPS)
    assert differing(resumed["model"], uninterrupted["model"]) == []
    assert differing(resumed["optimizer"], uninterrupted["optimizer"]) == []
    assert differing(framework.scheduler(resumed), framework.scheduler(uninterrupted)) == []


def test_sigkill_mid_save_resumes_from_the_previous_commit(framework, tmp_path):
    args = ("--steps", "30", "--every-steps", "4", "--n-embd", "192")
    reference = tmp_path / "reference"
    assert run(framework.module, reference, *args)[0] == 0
    uri = tmp_path / "ckpt"
    torn, previous = kill_mid_save(framework.module, uri, *args, "--step-delay", "0.05")
    assert previous is not None and previous < torn
    code, out = run(framework.module, uri, *args)
    assert code == 0, out
    assert f"resumed at step {previous} from" in out
    assert differing(final_state(uri, 30)["model"], final_state(reference, 30)["model"]) == []


def test_preflight_as_another_framework_fails_at_the_first_checkpoint_naming_what_wrote_it(framework, tmp_path):
    """`respawn-agent preflight --framework <other>` on this framework's example. That the
    example's own framework passes preflight, as printed on its docs page, is
    tests/docs/test_snippets.py's."""
    script = (sys.executable, "-m", framework.module, "--steps", str(STEPS))
    proc = preflight(framework.other, tmp_path / "pf-other", *script, "--step-delay", "0.5")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "reference run: checkpoint" in proc.stdout
    assert f"was written by '{framework.name}', expected '{framework.other}'" in proc.stdout
    assert not reference_run_finished(tmp_path / "pf-other", STEPS)  # told at its first checkpoint


def test_another_frameworks_checkpoint_is_refused_and_kept(framework, tmp_path):
    uri = tmp_path / "ckpt"
    other = Checkpointer(TrainState(tiny_lm.make_model()), CheckpointConfig(uri=str(uri), handle_signals=False),
                         framework=framework.other)
    other.save(5, kind="final")
    other.close()
    before = sorted(p.relative_to(uri) for p in uri.rglob("*"))
    code, out = run(framework.module, uri, "--steps", "10")
    assert code != 0
    assert framework.other_says in out and "nothing was deleted" in out
    assert sorted(p.relative_to(uri) for p in uri.rglob("*")) == before


def test_the_agent_and_the_checkpoint_library_import_no_framework():
    probe = ("import sys, respawn.agent.__main__, respawn.agent.lifecycle, respawn.checkpoint.checkpointer, "
             "respawn.checkpoint.validate, respawn.integrations; "
             "print(sorted(m for m in ('transformers', 'accelerate', 'lightning', 'pytorch_lightning') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stderr


def test_hf_checkpoints_are_validated_with_the_models_own_loss(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.setenv("RESPAWN_MODEL_FACTORY", "respawn.examples.hf_trainer:make_model")
    monkeypatch.setenv("RESPAWN_BATCH_FACTORY", "respawn.examples.hf_trainer:validation_batch")
    uri = tmp_path / "ckpt"
    code, out = run(FRAMEWORKS["hf"].module, uri, "--steps", "12", "--every-steps", "6", keep_env=("RESPAWN_MODEL_FACTORY", "RESPAWN_BATCH_FACTORY"))
    assert code == 0, out
    verdict = json.loads((uri / "step-00000012" / "VALIDATION.json").read_text())
    assert verdict["result"] == "valid" and verdict["loss"] == verdict["reference_loss"]
    assert (uri / "export").is_dir()  # finish() exported the validated weights
