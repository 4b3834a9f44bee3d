"""Validation and export: a checkpoint must reproduce its reference loss to be trusted."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from respawn.checkpoint import Checkpointer, ExportRefusedError, export_weights, validate
from respawn.checkpoint import layout, manifest
from respawn.checkpoint.reader import CheckpointRef
from respawn.checkpoint.storage.local import LocalStorage
from respawn.examples import tiny

from .conftest import ROOT_DIR, config, train


def weights_after(state, data, root, steps, validation):
    ckpt = Checkpointer(state, config(root, validation=validation))
    train(state, data, ckpt, 0, steps)
    ckpt.close()
    return {k: v.clone() for k, v in state.model.state_dict().items()}, state.optimizer.state_dict()


def test_the_reference_loss_at_save_time_does_not_disturb_training(tmp_path, data):
    with_validation, opt_a = weights_after(tiny.build(), data, str(tmp_path / "a"), 12, tiny.VALIDATION)
    without, opt_b = weights_after(tiny.build(), data, str(tmp_path / "b"), 12, None)
    for name in with_validation:
        assert torch.equal(with_validation[name], without[name]), name
    assert all(torch.equal(opt_a["state"][i]["exp_avg"], opt_b["state"][i]["exp_avg"]) for i in opt_a["state"])


def test_an_intact_checkpoint_validates(root, state, data):
    weights_after(state, data, root, 5, tiny.VALIDATION)
    verdict = validate(f"{root}/{layout.step_dir(5)}")
    assert verdict.valid and verdict.loss == pytest.approx(verdict.reference_loss, abs=1e-6)


def test_a_notice_save_computes_its_reference_loss_from_the_weights_it_writes_in_place(tmp_path, data):
    state = tiny.build()
    periodic = Checkpointer(state, config(str(tmp_path / "periodic")))
    train(state, data, periodic, 0, 5)
    periodic.close()
    notice = Checkpointer(state, config(str(tmp_path / "notice")))
    assert notice.save(5, kind="notice").committed
    assert notice.host_buffer_bytes == 0  # nothing copied, the weights included
    saved = {kind: json.loads(Path(tmp_path, kind, layout.step_dir(5), layout.STATE).read_text()) for kind in ("periodic", "notice")}
    assert saved["notice"]["reference_loss"] == saved["periodic"]["reference_loss"]
    verdict = validate(str(tmp_path / "notice" / layout.step_dir(5)))
    assert verdict.valid and verdict.loss == pytest.approx(verdict.reference_loss, abs=1e-6)


def tamper_and_reseal(root: str, step: int) -> None:
    """Change the first weight matrix inside the data file and recompute the manifest
    digests, as a buggy writer or a bad actor would; only validation can catch it."""
    storage = LocalStorage(root)
    ckpt = layout.step_dir(step)
    state = json.loads(Path(root, ckpt, layout.STATE).read_text())
    slot = state["slots"][state["skeleton"]["model"]["0.weight"]["__tensor__"]]
    path = Path(root, ckpt, layout.data_file(0, slot["file"]))
    raw = bytearray(path.read_bytes())
    weights = torch.frombuffer(raw, dtype=torch.uint8)[slot["offset"]: slot["offset"] + slot["nbytes"]].view(torch.float32)
    weights.mul_(3.0)
    reseal(storage, ckpt, path, bytes(raw))


def reseal(storage: LocalStorage, ckpt: str, path: Path, raw: bytes) -> None:
    """`raw` written to `path` with the manifest's digest of it made to match."""
    path.write_bytes(raw)
    body = json.loads(storage.read(f"{ckpt}/{layout.MANIFEST}"))
    body["files"][path.name] = {"size": len(raw), "digest": manifest.digest_bytes(raw)}
    storage.write_atomic(f"{ckpt}/{layout.MANIFEST}", json.dumps(body).encode())


def test_altered_weights_with_recomputed_digests_fail_validation(root, state, data):
    weights_after(state, data, root, 5, tiny.VALIDATION)
    tamper_and_reseal(root, 5)
    manifest.verify_all(LocalStorage(root), layout.step_dir(5))  # the digests match...
    verdict = validate(f"{root}/{layout.step_dir(5)}")
    assert not verdict.valid and "differs from reference" in verdict.message  # ...validation does not


def test_resume_validates_the_newest_and_falls_back_when_it_is_invalid(root, state, data):
    ckpt = Checkpointer(state, config(root))
    train(state, data, ckpt, 0, 5)
    ckpt.wait()
    train(state, data, ckpt, 5, 10)
    ckpt.close()
    tamper_and_reseal(root, 10)
    resumed = tiny.build()
    again = Checkpointer(resumed, config(root))
    assert again.load_latest().step == 5
    ref = CheckpointRef(LocalStorage(root), layout.step_dir(10))
    assert ref.validation()["result"] == "invalid"
    assert CheckpointRef(LocalStorage(root), layout.step_dir(5)).validation()["result"] == "valid"
    # Training past the invalid step replaces it with a fresh, pending, valid checkpoint.
    train(resumed, data, again, 5, 10)
    again.close()
    assert ref.validation() is None
    assert validate(ref.uri).valid


def test_a_checkpoint_whose_reference_loss_is_not_a_number_is_skipped_as_corrupt(root, state, data):
    """Intact digests over a malformed meta (a buggy writer): the resume falls back to the
    previous checkpoint and marks this one, instead of failing inside the comparison."""
    ckpt = Checkpointer(state, config(root))
    train(state, data, ckpt, 0, 5)
    ckpt.wait()
    train(state, data, ckpt, 5, 10)
    ckpt.close()
    path = Path(root, layout.step_dir(10), layout.STATE)
    meta = json.loads(path.read_text())
    meta["reference_loss"] = str(meta["reference_loss"])
    reseal(LocalStorage(root), layout.step_dir(10), path, json.dumps(meta).encode())

    resumed = Checkpointer(tiny.build(), config(root)).load_latest()
    assert resumed.step == 5
    assert "reference loss" in resumed.skipped[0].reason and "is not a number" in resumed.skipped[0].reason
    assert CheckpointRef(LocalStorage(root), layout.step_dir(10)).validation()["result"] == "invalid"


def test_export_is_refused_for_an_unvalidated_checkpoint(root, state, data):
    weights_after(state, data, root, 5, tiny.VALIDATION)
    with pytest.raises(ExportRefusedError, match=r"refusing to export .*step-00000005: its validation is pending"):
        export_weights(CheckpointRef(LocalStorage(root), layout.step_dir(5)))


def test_finish_validates_the_final_checkpoint_then_exports_safetensors_with_digest(root, state, data):
    ckpt = Checkpointer(state, config(root))
    train(state, data, ckpt, 0, 7)
    artifact = ckpt.finish(7)
    assert artifact.uri == f"{root}/export/step-00000007/model.safetensors"
    exported = load_file(artifact.uri)
    for name, tensor in state.model.state_dict().items():
        assert torch.equal(exported[name], tensor)
    assert artifact.digest == "sha256:" + hashlib.sha256(Path(artifact.uri).read_bytes()).hexdigest()


def test_the_validate_command_prints_a_json_verdict_in_a_separate_process(root, state, data):
    weights_after(state, data, root, 5, tiny.VALIDATION)
    uri = f"{root}/{layout.step_dir(5)}"
    done = subprocess.run([sys.executable, "-m", "respawn.checkpoint.validate", uri], capture_output=True, text=True,
                          cwd=ROOT_DIR, timeout=120)
    assert done.returncode == 0, done.stderr
    verdict = json.loads(done.stdout)
    assert verdict["result"] == "valid" and verdict["loss"] == pytest.approx(verdict["reference_loss"], abs=1e-6)
    tamper_and_reseal(root, 5)
    done = subprocess.run([sys.executable, "-m", "respawn.checkpoint.validate", uri], capture_output=True, text=True,
                          cwd=ROOT_DIR, timeout=120)
    assert done.returncode == 1 and json.loads(done.stdout)["result"] == "invalid"
