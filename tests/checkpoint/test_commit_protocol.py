"""The on-disk commit protocol (DESIGN §6): what exists, what loads, what never loads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from respawn.checkpoint import (
    Checkpointer,
    ConfigError,
    CorruptCheckpointError,
    FactoryError,
    IncompatibleCheckpointError,
    ValidationSettings,
    validate,
)
from respawn.checkpoint import layout, manifest
from respawn.checkpoint.reader import CheckpointRef, committed, load
from respawn.checkpoint.storage import UnknownSchemeError, open_storage
from respawn.checkpoint.storage.local import LocalStorage
from respawn.examples import tiny

from .conftest import ROOT_DIR, config, train
from .test_eval_fn import validate_cli
from .factories import wide_model


def saved_checkpoint(root, state, data, steps=5) -> str:
    ckpt = Checkpointer(state, config(root))
    train(state, data, ckpt, 0, steps)
    ckpt.close()
    return f"{root}/{layout.step_dir(steps)}"


def test_a_committed_checkpoint_has_data_state_and_a_manifest_naming_every_file(root, state, data):
    uri = saved_checkpoint(root, state, data)
    names = sorted(os.listdir(uri))
    assert names == ["MANIFEST.json", "data-r0-0.bin", "data-r0-1.bin", "state.json"]
    body = json.loads(Path(uri, "MANIFEST.json").read_text())
    assert body["digest_algorithm"] == "xxh3_128"
    assert set(body["files"]) == {"data-r0-0.bin", "data-r0-1.bin", "state.json"}
    for name, entry in body["files"].items():
        assert entry["size"] == os.path.getsize(Path(uri, name))
    assert Path(root, "LATEST").read_text() == layout.step_dir(5)


def test_a_manifest_says_which_tiers_held_its_step_and_one_from_before_tiers_were_recorded_says_storage(root, state, data):
    uri = saved_checkpoint(root, state, data)
    path = Path(uri, "MANIFEST.json")
    body = json.loads(path.read_text())
    assert body["tiers"] == ["storage"]  # one process: no memory tier
    storage = LocalStorage(root)
    path.write_text(json.dumps({k: v for k, v in body.items() if k != "tiers"}))
    assert manifest.read(storage, layout.step_dir(5)).tiers == ("storage",)
    for garbled in (["memory"], ["storage", "tape"], "storage"):
        path.write_text(json.dumps(body | {"tiers": garbled}))
        with pytest.raises(CorruptCheckpointError, match=r"MANIFEST.json is malformed \(tiers"):
            manifest.read(storage, layout.step_dir(5))


def test_loading_restores_the_saved_weights_exactly(root, state, data):
    uri = saved_checkpoint(root, state, data)
    fresh = tiny.build()
    step = Checkpointer(fresh, config(root)).load_latest().step
    assert step == 5
    for name, tensor in state.model.state_dict().items():
        assert fresh.model.state_dict()[name].equal(tensor), name
    assert fresh.sampler.state_dict() == state.sampler.state_dict()
    assert Path(uri).exists()


def test_a_directory_without_manifest_is_never_loaded(root, state, data):
    uri = saved_checkpoint(root, state, data)
    os.remove(Path(uri, "MANIFEST.json"))
    with pytest.raises(CorruptCheckpointError, match=r"step-00000005.*no MANIFEST.json"):
        load(CheckpointRef(LocalStorage(root), layout.step_dir(5)))
    assert Checkpointer(tiny.build(), config(root)).load_latest().step == 0


def test_a_flipped_byte_fails_the_digest(root, state, data):
    uri = saved_checkpoint(root, state, data)
    path = Path(uri, "data-r0-0.bin")
    raw = bytearray(path.read_bytes())
    raw[100] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptCheckpointError, match=r"step-00000005: file data-r0-0.bin fails its xxh3_128 digest"):
        load(CheckpointRef(LocalStorage(root), layout.step_dir(5)))


def test_a_truncated_file_is_named(root, state, data):
    uri = saved_checkpoint(root, state, data)
    path = Path(uri, "data-r0-1.bin")
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CorruptCheckpointError, match=r"data-r0-1.bin is \d+ bytes, manifest says \d+ \(truncated"):
        load(CheckpointRef(LocalStorage(root), layout.step_dir(5)))


def test_a_manifest_naming_a_missing_file_is_refused(root, state, data):
    uri = saved_checkpoint(root, state, data)
    os.remove(Path(uri, "data-r0-1.bin"))
    with pytest.raises(CorruptCheckpointError, match=r"step-00000005: file data-r0-1.bin named in the manifest is missing"):
        load(CheckpointRef(LocalStorage(root), layout.step_dir(5)))


def test_resume_skips_a_corrupt_newest_checkpoint_and_marks_it(root, state, data):
    ckpt = Checkpointer(state, config(root))
    train(state, data, ckpt, 0, 5)
    ckpt.wait()
    train(state, data, ckpt, 5, 10)
    ckpt.close()
    Path(root, layout.step_dir(10), "data-r0-0.bin").write_bytes(b"garbage")
    resumed = Checkpointer(tiny.build(), config(root)).load_latest()
    assert (resumed.step, resumed.uri) == (5, f"{root}/{layout.step_dir(5)}")
    [skipped] = resumed.skipped
    assert (skipped.step, skipped.uri) == (10, f"{root}/{layout.step_dir(10)}")
    assert skipped.reason.startswith("corrupt: ") and "data-r0-0.bin" in skipped.reason
    assert str(resumed).startswith(f"resumed at step 5 from {root}/{layout.step_dir(5)}; skipped {root}/{layout.step_dir(10)}: corrupt")
    marked = json.loads(Path(root, layout.step_dir(10), layout.VALIDATION).read_text())
    assert marked["result"] == "invalid" and "data-r0-0.bin" in marked["message"]


def test_a_checkpoint_of_another_model_is_a_shape_error_naming_it(root, state, data):
    uri = saved_checkpoint(root, state, data)
    wide = tiny.build()
    wide.model = wide_model()
    settings = ValidationSettings("tests.checkpoint.factories:wide_model", tiny.VALIDATION.batch_factory)
    with pytest.raises(IncompatibleCheckpointError, match=r"step-00000005: 0.weight has shape \(64, 16\), the model expects \(128, 16\)"):
        validate(uri, settings)
    with pytest.raises(IncompatibleCheckpointError, match="step-00000005"):
        Checkpointer(wide, config(root, validation=None)).load_latest()


def test_an_unimportable_factory_is_named(root, state, data):
    uri = saved_checkpoint(root, state, data)
    settings = ValidationSettings("no_such_module.models:build", tiny.VALIDATION.batch_factory)
    verdict = validate(uri, settings)  # the check could not run: an `error` verdict naming why, not `invalid`
    assert verdict.result == "error"
    assert "cannot import module 'no_such_module.models' of factory 'no_such_module.models:build'" in verdict.message
    with pytest.raises(FactoryError, match="must look like 'package.module:function'"):
        ValidationSettings("just_a_name", "x:y")


def test_an_unknown_storage_scheme_is_refused():
    with pytest.raises(UnknownSchemeError, match=r"unknown storage URI scheme 'ftp' in 'ftp://host/ckpt'"):
        open_storage("ftp://host/ckpt")


def test_a_starved_validator_still_finds_the_checkpoint_it_started_on(root, state, data):
    """The agent's validator runs at the lowest priority: on a VM whose CPUs training keeps
    busy it may take longer than `keep` commits. It is frozen here (SIGSTOP, as starved)
    once it has claimed step 5; three commits later step 5 is still there to be read,
    and its verdict is `valid`, not `unreadable`. A newer verdict then releases it."""
    ckpt = Checkpointer(state, config(root, keep=2))
    train(state, data, ckpt, 0, 5)
    ckpt.wait()
    uri = f"{root}/{layout.step_dir(5)}"
    validator = subprocess.Popen([sys.executable, "-m", "respawn.checkpoint.validate", uri], cwd=ROOT_DIR,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not Path(uri, layout.VALIDATING).exists():
            assert validator.poll() is None and time.monotonic() < deadline, "the validator never claimed step 5"
            time.sleep(0.01)
        validator.send_signal(signal.SIGSTOP)
        for start in range(5, 20, 5):
            train(state, data, ckpt, start, start + 5)
            ckpt.wait()
        assert [r.step for r in committed(LocalStorage(root))] == [5, 15, 20]
        validator.send_signal(signal.SIGCONT)
        output, _ = validator.communicate(timeout=120)
    finally:
        validator.kill()
    assert json.loads(output.strip().splitlines()[-1])["result"] == "valid", output
    assert validate(f"{root}/{layout.step_dir(20)}").valid
    train(state, data, ckpt, 20, 25)
    ckpt.close()
    assert [r.step for r in committed(LocalStorage(root))] == [20, 25]


def test_the_validator_given_no_checkpoint_or_one_rotated_away_says_so_and_its_claim_leaves_nothing(
        root, state, data):
    saved_checkpoint(root, state, data)
    code, verdict = validate_cli(f"{root}/not-a-step")
    assert (code, verdict["result"]) == (1, "invalid") and "does not name a checkpoint directory" in verdict["message"]
    assert not Path(root, "not-a-step").exists()
    # Rotated away before the validator started: unreadable, not condemned; the claim it wrote
    # makes a directory with no manifest, never loaded, and gone at the next commit.
    gone = f"{root}/{layout.step_dir(3)}"
    code, verdict = validate_cli(gone)
    assert (code, verdict["result"], verdict.get("unreadable")) == (1, "invalid", True), verdict
    assert [r.step for r in committed(LocalStorage(root))] == [5]
    ckpt = Checkpointer(state, config(root))
    assert ckpt.load_latest().step == 5
    train(state, data, ckpt, 5, 10)
    ckpt.close()
    assert sorted(p.name for p in Path(root).iterdir()) == ["LATEST", layout.step_dir(5), layout.step_dir(10)]


def test_keeping_one_checkpoint_is_refused(root):
    with pytest.raises(ConfigError, match="keep at least 2"):
        config(root, keep=1)


def test_rotation_keeps_the_last_k(root, state, data):
    ckpt = Checkpointer(state, config(root, keep=2))
    for start in range(0, 20, 5):
        train(state, data, ckpt, start, start + 5)
        ckpt.wait()
    ckpt.close()
    assert [r.step for r in committed(LocalStorage(root))] == [15, 20]


def test_rotation_keeps_the_newest_valid_until_a_successor_validates(root, state, data):
    ckpt = Checkpointer(state, config(root, keep=2))
    train(state, data, ckpt, 0, 5)
    ckpt.wait()
    assert validate(f"{root}/{layout.step_dir(5)}").valid
    for start in range(5, 20, 5):
        train(state, data, ckpt, start, start + 5)
        ckpt.wait()
    steps = [r.step for r in committed(LocalStorage(root))]
    assert steps == [5, 15, 20]  # K newest pending + the newest valid
    assert validate(f"{root}/{layout.step_dir(20)}").valid
    train(state, data, ckpt, 20, 25)
    ckpt.close()
    assert [r.step for r in committed(LocalStorage(root))] == [20, 25]
