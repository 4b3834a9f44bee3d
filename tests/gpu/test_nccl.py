"""Checkpoints of CUDA state in a gang whose default group is NCCL, as a GPU job's is:
sharded ones (DCP, DDP and FSDP2) and per-rank ones resume bitwise, with DCP's
collectives and the ranks' agreement on the coordinator's own gloo group.

NCCL refuses two ranks on one GPU, so on a machine with one GPU the gang has one rank
(an NCCL default group beside the gloo coordinator); with two GPUs or more a gang of
two runs as well. Ranks are spawned, not forked: the test process may hold CUDA."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from respawn.checkpoint import CheckpointConfig, Checkpointer, ShardedCheckpointer, TrainState
from respawn.checkpoint.distributed import init_process_group, leave_process_group
from respawn.examples import dcp_loop
from tests.checkpoint.ranks import free_port

from . import CUDA, on_host

pytestmark = [*CUDA, pytest.mark.skipif(not dist.is_nccl_available(), reason="this torch is built without NCCL")]

STEPS = 4


def config(uri: str, **overrides) -> CheckpointConfig:
    return CheckpointConfig(**({"uri": uri, "num_files": 2, "handle_signals": False} | overrides))


def sharded_round_trip(wrap: str, uri: str) -> None:
    state = dcp_loop.build(wrap, device="cuda")
    ckpt = ShardedCheckpointer(state, config(uri, every_steps=2))
    assert (dist.get_backend(), dist.get_backend(ckpt.coord.group)) == ("nccl", "gloo")
    data = dcp_loop.dataset("cuda")
    for step in range(STEPS):
        dcp_loop.train_step(state, data)
        ckpt.save(step + 1)
    assert ckpt.last_outcome.step == STEPS and ckpt.last_outcome.committed, ckpt.last_outcome
    ckpt.close()
    written = on_host(dcp_loop.full_state(state))
    fresh = dcp_loop.build(wrap, init_seed=1, device="cuda")
    resumed = ShardedCheckpointer(fresh, config(uri))
    assert resumed.load_latest().step == STEPS
    resumed.close()
    difference = dcp_loop.first_difference(written, on_host(dcp_loop.full_state(fresh)))
    assert difference is None, f"{wrap}: the resumed state differs at {difference}"


def per_rank_round_trip(uri: str) -> None:
    """The per-rank Checkpointer of a DDP replica: periodic saves (side-stream copies, the
    update waiting for them) where the gang agrees, then a notice save of the last step."""
    state = dcp_loop.build("ddp", device="cuda")
    ckpt = Checkpointer(TrainState(state.model, state.optimizer), config(uri, every_steps=2))
    data = dcp_loop.dataset("cuda")
    for step in range(STEPS):
        dcp_loop.train_step(state, data)
        ckpt.save(step + 1)
    final = ckpt.save(STEPS, kind="notice")
    ckpt.close()
    assert final.committed, final.message
    written = on_host({"model": state.model.state_dict(), "optimizer": state.optimizer.state_dict()})
    fresh = dcp_loop.build("ddp", init_seed=1, device="cuda")
    resumed = Checkpointer(TrainState(fresh.model, fresh.optimizer), config(uri))
    assert resumed.load_latest().step == STEPS
    resumed.close()
    difference = dcp_loop.first_difference(written, on_host({"model": fresh.model.state_dict(),
                                                            "optimizer": fresh.optimizer.state_dict()}))
    assert difference is None, f"per-rank: the resumed state differs at {difference}"


def run_rank(rank: int, world: int, port: int, root: str) -> None:
    # Both backends' bootstrap on the loopback: a test VM's host name may resolve nowhere.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    torch.cuda.set_device(rank)
    init_process_group("nccl", timeout_s=120, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        for wrap in ("ddp", "fsdp"):
            sharded_round_trip(wrap, f"{root}/{wrap}")
        per_rank_round_trip(f"{root}/per-rank")
    except BaseException:
        dist.destroy_process_group()  # no barrier: a failed rank must not wait for the others
        raise
    leave_process_group()


@pytest.mark.parametrize("world", [1, pytest.param(2, marks=pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank and this machine has fewer than 2"))])
def test_cuda_state_saves_and_resumes_bitwise_under_an_nccl_default_group(tmp_path, world):
    mp.spawn(run_rank, args=(world, free_port(), str(tmp_path)), nprocs=world, join=True)
