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


def one_rank() -> tuple[TrainState, nn.Module]:
    """This rank's state under an initialised process group, and its model wrapped for the gang."""
    state = tiny.build(rank=dist.get_rank(), world_size=dist.get_world_size())
    return state, DistributedDataParallel(state.model)  # broadcasts rank 0's weights


def train(config: CheckpointConfig, steps: int, step_delay_s: float = 0.0) -> Checkpointer:
    """Train this rank to `steps` under an initialised process group; returns the closed Checkpointer."""
    # No progress reports: ranks started together (torchrun --nproc-per-node) would share one status file.
    return tiny.train(config, steps, step_delay_s, setup=one_rank, report=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default=os.environ.get("RESPAWN_CHECKPOINT_URI", ""))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every-steps", type=int, default=25)
    parser.add_argument("--step-delay", type=float, default=0.0, help="sleep per step, to make a short run last")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    init_process_group("gloo")
    try:
        config = CheckpointConfig.from_env(uri=args.uri, every_steps=args.every_steps, validation=tiny.VALIDATION)
        train(config, args.steps, args.step_delay)
    except BaseException:
        dist.destroy_process_group()  # a peer may be gone: no barrier to wait on
        raise
    leave_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
