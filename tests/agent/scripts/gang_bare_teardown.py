"""A gang loop ended as most scripts end one: a bare `dist.destroy_process_group()`, no
barrier, no `leave_process_group()`. Run under `torchrun --nproc-per-node 2`."""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from respawn.checkpoint import CheckpointConfig, init_process_group
from respawn.examples import tiny_gang


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", required=True)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    init_process_group("gloo")
    tiny_gang.train(CheckpointConfig.from_env(uri=args.uri, every_steps=10), args.steps)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
