"""`tiny` on 2+ ranks with DistributedDataParallel over gloo (CPU).

Each rank checkpoints its own data files; rank 0 commits once every rank has
written; a stop (SIGTERM) seen by any one rank reaches all of them at the next
step, so all ranks save the same step before any exits.

    torchrun --nproc-per-node 2 -m respawn.examples.tiny_gang --uri /tmp/ckpt --steps 200
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from respawn.checkpoint import CheckpointConfig, Checkpointer, TrainState, init_process_group, leave_process_group
from respawn.examples import tiny


def one_rank(global_batch: int | None = None) -> tuple[TrainState, nn.Module]:
    """This rank's state under an initialised process group, and its model wrapped for the
    gang. `global_batch`: samples a step over all ranks, the same on any world size that
    divides it (an elastic gang resumes on fewer nodes in the same sample order); None:
    tiny.BATCH a rank."""
    world = dist.get_world_size()
    if global_batch is not None and global_batch % world:
        raise ValueError(f"global batch {global_batch} does not split over {world} ranks")
    batch = tiny.BATCH if global_batch is None else global_batch // world
    state = tiny.build(rank=dist.get_rank(), world_size=world, batch_size=batch)
    return state, DistributedDataParallel(state.model)  # broadcasts rank 0's weights


def train(config: CheckpointConfig, steps: int, step_delay_s: float = 0.0, global_batch: int | None = None,
          report: bool = False) -> Checkpointer:
    """Train this rank to `steps` under an initialised process group; returns the closed
    Checkpointer. `report`: progress to the agent, where each rank has its own (one a VM;
    ranks started together by torchrun --nproc-per-node would share one status file)."""
    return tiny.train(config, steps, step_delay_s, setup=lambda: one_rank(global_batch), report=report)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default=os.environ.get("RESPAWN_CHECKPOINT_URI", ""))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every-steps", type=int, default=25)
    parser.add_argument("--step-delay", type=float, default=0.0, help="sleep per step, to make a short run last")
    parser.add_argument("--global-batch", type=int, default=None, help="samples a step over all ranks (default: "
                        f"{tiny.BATCH} a rank); every world size the job runs on must divide it")
    parser.add_argument("--report", action="store_true", help="progress to the agent: one rank a VM")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    init_process_group("gloo")
    try:
        config = CheckpointConfig.from_env(uri=args.uri, every_steps=args.every_steps, validation=tiny.VALIDATION)
        train(config, args.steps, args.step_delay, args.global_batch, args.report)
    except BaseException:
        dist.destroy_process_group()  # a peer may be gone: no barrier to wait on
        raise
    leave_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
