"""Ranks agree on their own gloo group, never on the user's: with a default group that
cannot gather CPU tensors (as an NCCL-only one cannot), two ranks still resume, save
and stop together, and a stop asked of rank 1 alone stops both at the same step,
within the documented bound of 2·agree_every − 1 steps."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import FakeProcessGroup

from respawn.checkpoint import Checkpointer, layout
from respawn.checkpoint.reader import CheckpointRef
from respawn.checkpoint.storage.local import LocalStorage
from respawn.examples import tiny

from .conftest import config
from .ranks import fork_ranks, wait_all

WORLD = 2
STEPS = 40
STOP_AT = 8  # rank 1 asks for a stop just before its save() of this step
GPU_ONLY = "respawn_test_gpu_only"


def _gpu_only_backend(common_opts, backend_opts):
    # Like NCCL on a machine without CUDA tensors to give it: registered for "cuda" only,
    # so a collective on CPU tensors fails ("No backend type associated with device type cpu").
    return FakeProcessGroup._create_internal(common_opts.group_rank, common_opts.group_size, backend_opts)


def run_rank(root: str, rank: int, port: int, agree_every: int) -> dict:
    store = dist.TCPStore("127.0.0.1", port, WORLD, rank == 0, timeout=timedelta(seconds=30))
    dist.Backend.register_backend(GPU_ONLY, _gpu_only_backend, extended_api=True, devices=["cuda"])
    dist.init_process_group(GPU_ONLY, store=store, rank=rank, world_size=WORLD)
    try:
        dist.all_gather([torch.zeros(1) for _ in range(WORLD)], torch.zeros(1))
        refused = ""
    except RuntimeError as exc:
        refused = str(exc)
    state = tiny.build(rank=rank, world_size=WORLD)
    x, y = tiny.dataset()
    ckpt = Checkpointer(state, config(root, every_steps=5, agree_every_steps=agree_every))
    stopped_at, resumed = None, ckpt.load_latest().step
    for step in range(resumed, STEPS):
        tiny.train_step(state, x, y)
        if rank == 1 and step + 1 == STOP_AT:
            ckpt.request_stop()
        ckpt.save(step + 1)
        if ckpt.should_stop:
            stopped_at = step + 1
            break
    ckpt.close()
    result = {"refused": refused, "backend": dist.get_backend(ckpt.coord.group), "resumed": resumed, "stopped_at": stopped_at,
              "outcome_step": ckpt.last_outcome.step, "committed": ckpt.last_outcome.committed}
    dist.destroy_process_group()
    return result


def start(root: str, agree_every: int) -> list[int]:
    def run(rank: int, port: int) -> None:
        result = run_rank(root, rank, port, agree_every)
        Path(root, f"rank{rank}.json").write_text(json.dumps(result))

    return fork_ranks(WORLD, run)


@pytest.mark.parametrize("agree_every", [1, 3])
def test_a_stop_on_one_rank_stops_both_at_one_step_within_the_bound_without_the_default_group(tmp_path, agree_every):
    root = str(tmp_path / "ckpt")
    os.makedirs(root)
    assert wait_all(start(root, agree_every)) == [0, 0]
    results = [json.loads(Path(root, f"rank{r}.json").read_text()) for r in range(WORLD)]
    for result in results:
        assert "No backend type associated with device type cpu" in result["refused"]  # the setup is real
        assert result["backend"] == "gloo"
    stops = {r["stopped_at"] for r in results}
    assert len(stops) == 1, results
    stop = stops.pop()
    # The bound, worked out here from the schedule rather than taken from the code:
    # rows are shared at calls 1, 1+k, 1+2k, ... and read k calls later.
    assert STOP_AT < stop <= STOP_AT + 2 * agree_every - 1, results
    if agree_every == 3:
        assert stop == STOP_AT + 2 * agree_every - 1  # STOP_AT=8 just misses the share of call 7
    assert all(r["outcome_step"] == stop and r["committed"] for r in results), results
    ref = CheckpointRef(LocalStorage(root), layout.step_dir(stop))
    assert ref.is_committed()
    files = set(json.loads(Path(root, ref.name, layout.MANIFEST).read_text())["files"])
    assert {"state-rank1.json", "data-r0-0.bin", "data-r1-0.bin"} <= files


def test_both_ranks_resume_the_checkpoint_rank_0_picks_through_the_coordination_group(tmp_path):
    root = str(tmp_path / "ckpt")
    os.makedirs(root)
    assert wait_all(start(root, 1)) == [0, 0]
    stop = json.loads(Path(root, "rank0.json").read_text())["stopped_at"]
    assert wait_all(start(root, 1)) == [0, 0]  # resumed past STOP_AT: runs to the end
    results = [json.loads(Path(root, f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert [(r["resumed"], r["stopped_at"]) for r in results] == [(stop, None)] * WORLD
