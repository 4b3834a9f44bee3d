"""Validation with the user's own loss (issue 18 item 1): causal LMs, dict / ModelOutput
outputs, kwargs batches, an eval_fn; and an eval_fn that fails makes the verdict
`error` (the check failed), never `invalid`, and costs no checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from respawn.checkpoint import Checkpointer, EvalError, TrainState, ValidationSettings, layout
from respawn.checkpoint.validation import default_loss
from respawn.examples import tiny_lm

from .conftest import ROOT_DIR, config

LM = ValidationSettings("respawn.examples.tiny_lm:make_model", "respawn.examples.tiny_lm:validation_batch", 1e-5)
DICT_LM = ValidationSettings("respawn.examples.tiny_lm:make_dict_model", "respawn.examples.tiny_lm:labelled_batch", 1e-5)
RAISES = "tests.checkpoint.factories:eval_fn_that_raises"
NAN = "tests.checkpoint.factories:eval_fn_that_gives_nan"


def train_lm(root: str, validation: ValidationSettings, steps: int = 10, dict_output: bool = False) -> TrainState:
    """A causal LM trained on kwargs batches (`model(**batch)`), saved every 5 steps."""
    torch.manual_seed(0)
    model = tiny_lm.make_dict_model() if dict_output else tiny_lm.make_model()
    state = TrainState(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    ckpt = Checkpointer(state, config(root, validation=validation))
    model.train()
    for step in range(steps):
        ids = tiny_lm.tokens(4, 100 + step)
        out = model(**({"input_ids": ids, "labels": ids} if dict_output else {"input_ids": ids}))
        loss = out["loss"] if dict_output else tiny_lm.shifted_cross_entropy(out, ids)
        state.optimizer.zero_grad()
        loss.backward()
        state.optimizer.step()
        ckpt.save(step + 1)
        ckpt.wait()  # every due save commits: the tests name the checkpoints they expect
    ckpt.close()
    return state


def validate_cli(uri: str, *args: str) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "respawn.checkpoint.validate", uri, *args], capture_output=True,
                          text=True, cwd=ROOT_DIR, timeout=120)
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


def test_the_default_loss_scores_a_causal_lm_shifted_and_reads_dict_outputs():
    model, ids = tiny_lm.make_model().eval(), tiny_lm.tokens(3, 1)
    logits = model(ids)
    shifted = F.cross_entropy(logits[:, :-1].reshape(-1, 64), ids[:, 1:].reshape(-1)).item()
    unshifted = F.cross_entropy(logits.reshape(-1, 64), ids.reshape(-1)).item()
    assert shifted != unshifted
    assert default_loss(model, {"input_ids": ids}) == pytest.approx(shifted)  # kwargs batch, targets = input_ids
    assert default_loss(model, (ids, ids)) == pytest.approx(shifted)  # (inputs, targets), [B, T, V] vs [B, T]
    masked = ids.clone()
    masked[:, 8:] = -100  # padding is not scored
    expected = F.cross_entropy(logits[:, :-1].reshape(-1, 64), masked[:, 1:].reshape(-1), ignore_index=-100).item()
    assert default_loss(model, {"input_ids": ids, "labels": masked}) == pytest.approx(expected)
    dict_model = tiny_lm.make_dict_model().eval()
    assert default_loss(dict_model, {"input_ids": ids, "labels": ids}) == pytest.approx(shifted)  # its own loss
    assert default_loss(dict_model, {"input_ids": ids}) == pytest.approx(shifted)  # no loss: its logits


@pytest.mark.parametrize("settings,dict_output", [(LM, False), (DICT_LM, True)], ids=["logits", "dict-output"])
def test_a_causal_lm_checkpoint_validates_in_a_separate_process(tmp_path, settings, dict_output):
    root = str(tmp_path / "ckpt")
    train_lm(root, settings, dict_output=dict_output)
    code, verdict = validate_cli(f"{root}/{layout.step_dir(10)}")
    assert (code, verdict["result"]) == (0, "valid"), verdict
    assert verdict["loss"] == pytest.approx(verdict["reference_loss"], rel=1e-5) and verdict["loss"] > 1


def test_the_users_eval_fn_is_the_loss_at_save_and_at_validation(tmp_path):
    root = str(tmp_path / "ckpt")
    state = train_lm(root, ValidationSettings(LM.model_factory, LM.batch_factory, 1e-5, "respawn.examples.tiny_lm:perplexity"))
    with torch.no_grad():
        expected = tiny_lm.perplexity(state.model.eval(), tiny_lm.validation_batch())
    stored = json.loads(Path(root, layout.step_dir(10), layout.STATE).read_text())
    assert stored["reference_loss"] == pytest.approx(expected, rel=1e-5)
    # The job names only its factories (the agent passes an empty --eval-fn): the checkpoint's own eval_fn is used.
    code, verdict = validate_cli(f"{root}/{layout.step_dir(10)}", "--model-factory", LM.model_factory,
                                 "--batch-factory", LM.batch_factory, "--eval-fn=")
    assert (code, verdict["result"]) == (0, "valid") and verdict["loss"] == pytest.approx(expected, rel=1e-5)


def test_an_eval_fn_that_raises_is_an_error_naming_it_and_costs_no_checkpoint(tmp_path):
    root = str(tmp_path / "ckpt")
    train_lm(root, ValidationSettings(LM.model_factory, LM.batch_factory, 1e-5, RAISES))
    # Saves still committed (a broken eval_fn must not stop them); rotation kept the newest two.
    assert [p.name for p in sorted(Path(root).glob("step-*"))] == [layout.step_dir(5), layout.step_dir(10)]
    uri = f"{root}/{layout.step_dir(10)}"
    code, verdict = validate_cli(uri)
    assert (code, verdict["result"]) == (2, "error"), verdict
    assert "ValueError: labels out of range for this vocabulary" in verdict["message"]
    assert json.loads(Path(uri, layout.VALIDATION).read_text())["result"] == "error"
    # Resuming checks it again, fails the same way and says why, rather than falling back or deleting anything.
    model = tiny_lm.make_model()
    ckpt = Checkpointer(TrainState(model, torch.optim.AdamW(model.parameters())),
                        config(root, validation=ValidationSettings(LM.model_factory, LM.batch_factory, 1e-5, RAISES)))
    with pytest.raises(EvalError, match="labels out of range"):
        ckpt.load_latest()
    ckpt.close()
    assert [p.name for p in sorted(Path(root).glob("step-*"))] == [layout.step_dir(5), layout.step_dir(10)]


def test_an_eval_fn_that_gives_nan_is_an_error_and_a_fixed_one_validates_the_same_checkpoint(tmp_path):
    root = str(tmp_path / "ckpt")
    train_lm(root, LM)
    uri = f"{root}/{layout.step_dir(10)}"
    code, verdict = validate_cli(uri, "--model-factory", LM.model_factory, "--batch-factory", LM.batch_factory,
                                 f"--eval-fn={NAN}")
    assert (code, verdict["result"]) == (2, "error") and "returned nan, not a finite number" in verdict["message"]
    model = tiny_lm.make_model()
    ckpt = Checkpointer(TrainState(model, torch.optim.AdamW(model.parameters())), config(root, validation=LM))
    assert ckpt.load_latest().step == 10  # a recorded `error` is checked again on resume, and passes now
    ckpt.close()
    assert json.loads(Path(uri, layout.VALIDATION).read_text())["result"] == "valid"


def test_a_checkpoint_of_another_model_is_an_error_not_invalid(tmp_path):
    root = str(tmp_path / "ckpt")
    train_lm(root, LM)
    code, verdict = validate_cli(f"{root}/{layout.step_dir(10)}", "--model-factory", "respawn.examples.tiny:make_model",
                                 "--batch-factory", "respawn.examples.tiny:validation_batch")
    assert (code, verdict["result"]) == (2, "error") and "does not fit the model" in verdict["message"]
