"""Sharded and replicated gang state through torch.distributed.checkpoint (agents/respawn/checkpoint/sharded.py):
gangs of forked gloo ranks on CPU, DDP and FSDP2 (`fully_shard` on a CPU DeviceMesh)."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from respawn.checkpoint import CheckpointConfig, IncompatibleCheckpointError, ShardedCheckpointer, ValidationSettings, layout, manifest
from respawn.checkpoint.sampler import ResumableSampler
from respawn.checkpoint.validation import default_loss
from respawn.examples import dcp_loop

from .ranks import run_gang as gang
from .test_eval_fn import RAISES, validate_cli

VALIDATION = ValidationSettings("respawn.examples.dcp_loop:make_model", "respawn.examples.dcp_loop:validation_batch")


def write(tmp: Path, wrap: str, world: int, steps: int, *, uri: str | None = None, global_batch: int = 8,
          width: int = 64, **config) -> Path | str:
    """Train `steps` steps on `world` ranks, saving every 2 into `uri` (default: a folder of
    `tmp`); rank 0 keeps the full state and the next global batch it would draw in ref.pt.
    Returns the checkpoint root."""
    root = uri or tmp / "ckpt"

    def body(rank):
        state = dcp_loop.build(wrap, global_batch=global_batch, width=width)
        ckpt = ShardedCheckpointer(state, CheckpointConfig(uri=str(root), every_steps=2, handle_signals=False, **config))
        data = dcp_loop.dataset()
        for step in range(ckpt.load_latest().step, steps):
            dcp_loop.train_step(state, data)
            ckpt.save(step + 1)
        ckpt.close()
        full = dcp_loop.full_state(state)
        if rank == 0:
            torch.save(full, tmp / "ref.pt")

    assert gang(world, body) == [0] * world
    return root


def resume(tmp: Path, root: Path | str, wrap: str, world: int, *, global_batch: int = 8, width: int = 64) -> list[int]:
    """Load the newest checkpoint on `world` ranks into a differently initialised model;
    each rank records the step, whether its full state equals ref.pt bitwise, and its next batch."""
    def body(rank):
        state = dcp_loop.build(wrap, global_batch=global_batch, width=width, init_seed=7)
        ckpt = ShardedCheckpointer(state, CheckpointConfig(uri=str(root), handle_signals=False))
        resumed = ckpt.load_latest()
        assert dcp_loop.first_difference(torch.load(tmp / "ref.pt", weights_only=False), dcp_loop.full_state(state)) is None
        (tmp / f"resumed-{rank}.json").write_text(json.dumps({"step": resumed.step, "batch": state.sampler.next_batch()}))
        ckpt.close()

    return gang(world, body)


def global_batches(position: int, global_batch: int = 8) -> list[int]:
    """The global batch at `position` of epoch 0, as one rank alone would draw it."""
    sampler = ResumableSampler(dcp_loop.DATASET_SIZE, global_batch, seed=0)
    sampler.position = position
    return sampler.next_batch()


def resumed_batches(tmp: Path, world: int) -> tuple[int, list[int]]:
    rows = [json.loads((tmp / f"resumed-{r}.json").read_text()) for r in range(world)]
    assert len({row["step"] for row in rows}) == 1
    return rows[0]["step"], [i for row in rows for i in row["batch"]]


def test_ddp_replica_is_written_once_split_across_ranks_and_every_rank_loads_it(tmp_path):
    root = write(tmp_path, "ddp", 2, 4, width=512)  # big enough that DCP's per-tensor headers are noise
    ckpt = root / "step-00000004"
    files = json.loads((ckpt / "MANIFEST.json").read_text())["files"]
    data = {name: entry["size"] for name, entry in files.items() if name.endswith(".distcp")}
    per_rank = [sum(size for name, size in data.items() if name.startswith(f"__{r}_")) for r in range(2)]
    # One replica in all, each rank about half of it (DCP's dedup balances by bytes).
    assert sum(per_rank) < 1.1 * sum(t.numel() * t.element_size() for t in _tensors(torch.load(tmp_path / "ref.pt", weights_only=False)))
    assert all(0.35 < part / sum(per_rank) < 0.65 for part in per_rank), per_rank
    assert {"state.json", ".metadata", "rank-0.json", "rank-1.json"} <= files.keys()
    assert (root / "LATEST").read_text() == "step-00000004"
    assert resume(tmp_path, root, "ddp", 2, width=512) == [0, 0]
    assert resumed_batches(tmp_path, 2) == (4, global_batches(4))


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)


def test_fsdp2_shards_commit_under_our_protocol_with_rotation_and_reports(tmp_path):
    reports = tmp_path / "checkpoints.jsonl"
    root = write(tmp_path, "fsdp", 2, 6, keep=2, checkpoints_file=str(reports))
    assert sorted(p.name for p in root.iterdir()) == ["LATEST", "step-00000004", "step-00000006"]
    files = json.loads((root / "step-00000006" / "MANIFEST.json").read_text())["files"]
    shards = {n for n in files if n.endswith(".distcp")}
    assert {n.split("_")[2] for n in shards} == {"0", "1"} and all(re.fullmatch(r"__[01]_\d+\.distcp", n) for n in shards)
    assert sorted(os.listdir(root / "step-00000006")) == sorted([*files, "MANIFEST.json"])
    assert [json.loads(line)["step"] for line in reports.read_text().splitlines()] == [2, 4, 6]
    assert resume(tmp_path, root, "fsdp", 2) == [0, 0]
    assert resumed_batches(tmp_path, 2) == (6, global_batches(6))


@pytest.mark.parametrize("wrap", ["ddp", "fsdp"])
def test_a_periodic_save_commits_after_the_step_goes_on_and_holds_the_state_of_its_own_step(tmp_path, wrap):
    reports = tmp_path / "checkpoints.jsonl"
    root = tmp_path / "ckpt"

    def body(rank):
        state = dcp_loop.build(wrap)
        ckpt = ShardedCheckpointer(state, CheckpointConfig(uri=str(root), every_steps=2, keep=3, handle_signals=False,
                                                           checkpoints_file=str(reports)))
        data = dcp_loop.dataset()
        for step in range(6):
            dcp_loop.train_step(state, data)
            outcome = ckpt.save(step + 1)
            if step + 1 == 4:
                assert outcome.committed is None  # in flight: the step did not wait for the write
                full = dcp_loop.full_state(state)
                if rank == 0:
                    torch.save({"state": full, "batch": state.sampler.next_batch()}, tmp_path / "ref4.pt")
        ckpt.close()
        assert ckpt.last_outcome.step == 6 and ckpt.last_outcome.committed

    assert gang(2, body) == [0, 0]
    saves = [json.loads(line) for line in reports.read_text().splitlines()]
    assert [s["step"] for s in saves] == [2, 4, 6] and all(s["stall_s"] < s["save_s"] for s in saves), saves
    # Training changed every weight after step 4 while it was written: its checkpoint holds step 4's.
    (root / layout.step_dir(6) / layout.MANIFEST).unlink()
    ref = torch.load(tmp_path / "ref4.pt", weights_only=False)
    torch.save(ref["state"], tmp_path / "ref.pt")
    assert resume(tmp_path, root, wrap, 2) == [0, 0]
    assert resumed_batches(tmp_path, 2) == (4, global_batches(4))


@pytest.mark.parametrize("wrap,written_by,resumed_on", [("fsdp", 4, 2), ("fsdp", 2, 4), ("ddp", 4, 2), ("ddp", 2, 4)])
def test_resharded_resume_is_bitwise_with_the_same_global_sample_order(tmp_path, wrap, written_by, resumed_on):
    root = write(tmp_path, wrap, written_by, 4)
    assert resume(tmp_path, root, wrap, resumed_on) == [0] * resumed_on
    assert resumed_batches(tmp_path, resumed_on) == (4, global_batches(4))


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def refusals(tmp: Path, world: int, root: Path, load: bool = True, **build) -> list[str]:
    """Each rank's IncompatibleCheckpointError when `world` ranks build `dcp_loop.build(**build)`
    and a ShardedCheckpointer on `root` (and load its newest checkpoint)."""
    errors = tmp / "errors"
    errors.mkdir(exist_ok=True)

    def body(rank):
        state = dcp_loop.build(**{key: value(rank) if callable(value) else value for key, value in build.items()})
        with pytest.raises(IncompatibleCheckpointError) as caught:
            ckpt = ShardedCheckpointer(state, CheckpointConfig(uri=str(root), handle_signals=False))
            if load:
                ckpt.load_latest()
        (errors / str(rank)).write_text(str(caught.value))

    assert gang(world, body) == [0] * world
    return [(errors / str(rank)).read_text() for rank in range(world)]


def test_a_world_size_the_global_batch_does_not_split_over_is_refused_naming_it(tmp_path):
    root = write(tmp_path, "fsdp", 2, 2)
    before = _snapshot(root)
    # 3 ranks cannot split the checkpoint's global batch of 8
    message = refusals(tmp_path, 3, root, wrap="fsdp", global_batch=6)[2]
    assert "written by 2 ranks" in message and "cannot resume on 3 ranks" in message and "global batch 8" in message
    assert _snapshot(root) == before


def test_a_rank_with_another_model_is_refused_naming_it(tmp_path):
    root = tmp_path / "ckpt"
    # fully_shard takes it; DDP would refuse it itself
    for message in refusals(tmp_path, 2, root, load=False, wrap="fsdp", width=lambda rank: 64 if rank == 0 else 48):
        assert "rank 1: 0.bias is (48,) float32 there, (64,) float32 on rank 0" in message
    assert not root.exists() or not any(root.iterdir())


def test_a_checkpoint_of_another_model_is_refused_and_kept(tmp_path):
    root = write(tmp_path, "fsdp", 2, 2)
    before = _snapshot(root)
    message = refusals(tmp_path, 2, root, wrap="fsdp", width=32)[0]
    assert ("does not fit rank 0's model: ValueError: Size mismatch between saved torch.Size([64, 16]) and current: "
            "torch.Size([32, 16]) for model.0.weight") in message
    assert _snapshot(root) == before


def test_a_rank_killed_mid_save_leaves_no_manifest_and_the_previous_checkpoint_resumes(tmp_path):
    root = tmp_path / "ckpt"

    def body(rank):
        state = dcp_loop.build("fsdp", width=256)
        ckpt = ShardedCheckpointer(state, CheckpointConfig(uri=str(root), every_steps=2, handle_signals=False))
        data = dcp_loop.dataset()
        if rank == 1:
            def kill_once_rank_0_writes():  # rank 1 dies while rank 0 is writing its part of step 4
                while not (root / "step-00000004" / "__0_0.distcp").exists():
                    time.sleep(0.001)
                os.kill(os.getpid(), signal.SIGKILL)
            threading.Thread(target=kill_once_rank_0_writes, daemon=True).start()
        for step in range(4):
            dcp_loop.train_step(state, data)
            ckpt.save(step + 1)
        ckpt.close()  # commits the periodic save of step 4, whose writing rank 1 does not survive

    codes = gang(2, body, timeout_s=10)
    assert codes[1] == -signal.SIGKILL and codes[0] != 0
    assert not (root / "step-00000004" / "MANIFEST.json").exists()
    assert (root / "LATEST").read_text() == "step-00000002"

    def again(rank):
        state = dcp_loop.build("fsdp", width=256, init_seed=3)
        ckpt = ShardedCheckpointer(state, CheckpointConfig(uri=str(root), handle_signals=False))
        assert ckpt.load_latest().step == 2

    assert gang(2, again) == [0, 0]


def test_a_stop_seen_by_one_rank_saves_and_stops_every_rank_at_the_same_step(tmp_path):
    root = tmp_path / "ckpt"
    stopped = tmp_path / "stopped"
    stopped.mkdir()

    def body(rank):
        state = dcp_loop.build("fsdp")
        ckpt = ShardedCheckpointer(state, CheckpointConfig(uri=str(root), every_steps=100, handle_signals=False))
        data = dcp_loop.dataset()
        for step in range(20):
            dcp_loop.train_step(state, data)
            if rank == 1 and step + 1 == 5:
                ckpt.request_stop()
            outcome = ckpt.save(step + 1)
            if ckpt.should_stop:
                (stopped / str(rank)).write_text(json.dumps([step + 1, outcome.kind, outcome.committed]))
                break
        ckpt.close()

    assert gang(2, body) == [0, 0]
    rows = [json.loads((stopped / str(r)).read_text()) for r in range(2)]
    bound = 1  # Coordinator.stop_within_steps with agree_every_steps=1
    assert rows[0] == rows[1] and 5 <= rows[0][0] <= 5 + bound and rows[0][1:] == ["notice", True]
    assert (root / "LATEST").read_text() == f"step-{rows[0][0]:08d}"


def tamper_and_reseal(ckpt: Path) -> None:
    """Triple one weight matrix, rewrite DCP's files and put their digests in the manifest,
    as a buggy writer would: the digests pass, only validation can tell."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    state = _load_state_dict_from_keys(storage_reader=dcp.FileSystemReader(ckpt))
    state["model"]["0.weight"] *= 3
    def written() -> list[Path]:
        return [*ckpt.glob("*.distcp"), ckpt / ".metadata"]

    for path in written():
        path.unlink()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(ckpt), no_dist=True)
    body = json.loads((ckpt / layout.MANIFEST).read_text())
    body["files"] = {name: entry for name, entry in body["files"].items() if not name.endswith((".distcp", ".metadata"))}
    body["files"].update({p.name: {"size": p.stat().st_size, "digest": manifest.digest_bytes(p.read_bytes())} for p in written()})
    (ckpt / layout.MANIFEST).write_text(json.dumps(body))


@pytest.mark.parametrize("wrap", ["ddp", "fsdp"])
def test_the_validator_reloads_the_full_weights_of_every_rank_and_catches_altered_ones(tmp_path, wrap):
    reports = tmp_path / "checkpoints.jsonl"
    root = write(tmp_path, wrap, 2, 4, validation=VALIDATION, checkpoints_file=str(reports))
    ckpt = root / layout.step_dir(4)
    model = dcp_loop.make_model()
    model.load_state_dict(torch.load(tmp_path / "ref.pt", weights_only=False)["model"])  # the weights of step 4
    reference = json.loads((ckpt / layout.STATE).read_text())["reference_loss"]
    assert reference == pytest.approx(default_loss(model.eval(), dcp_loop.validation_batch()), rel=1e-6)
    assert json.loads(reports.read_text().splitlines()[-1])["reference_loss"] == reference
    code, verdict = validate_cli(str(ckpt))
    assert (code, verdict["result"]) == (0, "valid"), verdict
    code, verdict = validate_cli(str(ckpt), "--model-factory", "tests.checkpoint.factories:narrow_dcp_model",
                                 "--batch-factory", VALIDATION.batch_factory)
    assert (code, verdict["result"]) == (2, "error") and "0.weight has shape (64, 16)" in verdict["message"], verdict
    tamper_and_reseal(ckpt)
    code, verdict = validate_cli(str(ckpt))
    assert (code, verdict["result"]) == (1, "invalid") and "differs from reference" in verdict["message"], verdict


def test_an_eval_fn_that_raises_still_commits_and_its_verdict_is_error_deleting_nothing(tmp_path):
    root = write(tmp_path, "ddp", 2, 4, validation=replace(VALIDATION, eval_fn=RAISES))
    assert sorted(p.name for p in root.iterdir()) == ["LATEST", layout.step_dir(2), layout.step_dir(4)]
    meta = json.loads((root / layout.step_dir(4) / layout.STATE).read_text())
    assert "reference_loss" not in meta and "labels out of range" in meta["reference_error"]
    before = _snapshot(root)
    code, verdict = validate_cli(str(root / layout.step_dir(4)))
    assert (code, verdict["result"]) == (2, "error") and "labels out of range" in verdict["message"], verdict
    after = _snapshot(root)
    for written in (layout.VALIDATION, layout.VALIDATING):  # its verdict, and its claim as it started
        assert after.pop(f"{layout.step_dir(4)}/{written}")
    assert after == before
