"""Exact resume with DataLoader workers: ResumableLoader (torchdata's StatefulDataLoader)
in the TrainState, a model with dropout, `num_workers=2`.

Run: `python -m respawn.examples.loader_workers --uri /tmp/ckpt --steps 60 --order order.txt`.
Kill it at any moment (SIGKILL included) and run it again: it resumes from its newest
checkpoint, draws the same batches in the same order as an uninterrupted run would
(each step's sample ids go to --order, one line per step), takes the same dropout
masks, and ends with bitwise the same weights (--weights).

Under `torchrun --nproc-per-node N` it trains as a DDP gang over gloo (every rank reads the
same batches; each rank checkpoints its own files, rank 0 commits), the process tree of a
real multi-process job: torchrun, its ranks, each rank's loader workers.

`--dataset iterable` streams from an IterableDataset that shards itself by worker and
gives its position (state_dict); `--loader plain` shows the trap this replaces: a plain
`DataLoader(batch_sampler=ResumableSampler)` whose iterator is made after `load_latest()`
draws from torch's global RNG, so a resumed run's dropout differs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from respawn import trainer
from respawn.checkpoint import (CheckpointConfig, Checkpointer, ResumableLoader, ResumableSampler, TrainState,
                               init_process_group, leave_process_group)

FEATURES, CLASSES, SIZE, BATCH = 8, 3, 96, 8


def table() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(SIZE, FEATURES, generator=g)
    return x, x[:, :CLASSES].argmax(dim=1)


class Samples(Dataset):
    """Map-style: sample i is (x, y, i)."""

    def __init__(self):
        self.x, self.y = table()

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, i: int):
        return self.x[i], self.y[i], i


class Stream(IterableDataset):
    """A stream read in order, each worker its share (every num_workers-th sample);
    `position` is how far this worker's copy has read, saved and restored per worker."""

    def __init__(self):
        self.x, self.y = table()
        self.position = 0

    def __iter__(self):
        info = get_worker_info()
        mine = range(info.id if info else 0, SIZE, info.num_workers if info else 1)
        while self.position < len(mine):
            i = mine[self.position]
            self.position += 1
            yield self.x[i], self.y[i], i
        self.position = 0  # used up: the next epoch reads it again from the start

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, CLASSES))


def batches(loader):
    """Batches across epochs, for a loop counted in steps."""
    while True:
        yield from loader


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default=os.environ.get("RESPAWN_CHECKPOINT_URI", ""))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every-steps", type=int, default=10)
    parser.add_argument("--order", required=True, help="file: one line per step, 'step: sample ids'")
    parser.add_argument("--weights", help="file: the final weights (torch.save)")
    parser.add_argument("--dataset", choices=("map", "iterable"), default="map")
    parser.add_argument("--loader", choices=("resumable", "plain"), default="resumable")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--persistent-workers", action="store_true", help="keep the loader's workers across epochs")
    parser.add_argument("--step-delay", type=float, default=0.0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gang = int(os.environ.get("WORLD_SIZE", "1")) > 1  # started by torchrun
    if gang:
        init_process_group("gloo")
    rank = int(os.environ.get("RANK", "0"))
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if args.loader == "plain":
        sampler = ResumableSampler(SIZE, BATCH, seed=1)
        state = TrainState(model, optimizer, sampler=sampler)
    else:
        dataset = Samples() if args.dataset == "map" else Stream()
        loader = ResumableLoader(dataset, BATCH, seed=1, shuffle=args.dataset == "map", num_workers=args.workers,
                                 persistent_workers=args.persistent_workers and args.workers > 0)
        state = TrainState(model, optimizer, loader=loader)
    ckpt = Checkpointer(state, CheckpointConfig.from_env(uri=args.uri, every_steps=args.every_steps, num_files=1))
    forward = DistributedDataParallel(model) if gang else model
    resumed = ckpt.load_latest()
    print(resumed, flush=True)
    if args.loader == "plain":  # the trap: its iterator, made now, draws from the global RNG restored just before
        loader = DataLoader(Samples(), batch_sampler=sampler, num_workers=0)
    stream = batches(loader)
    with open(args.order if rank == 0 else os.devnull, "a") as order:
        for step in range(resumed.step, args.steps):
            x, y, ids = next(stream)
            loss = F.cross_entropy(forward(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            order.write(f"{step}: {','.join(map(str, ids.tolist()))}\n")
            order.flush()
            if args.step_delay:
                time.sleep(args.step_delay)
            if rank == 0:  # ranks on one VM share its status file
                trainer.report(step + 1, loss.item())
            ckpt.save(step + 1)
            if ckpt.should_stop:
                break
    ckpt.close()
    if gang:
        leave_process_group()
    if ckpt.should_stop:
        return 0
    if args.weights and rank == 0:
        torch.save(model.state_dict(), args.weights)
    print(f"done at step {args.steps}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
