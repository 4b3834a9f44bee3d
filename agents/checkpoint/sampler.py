"""A batch sampler that remembers where it is, so resume neither repeats nor skips a sample.

Each epoch is a permutation drawn from `seed + epoch` (independent of the global
RNG), split across ranks; `position` counts batches already handed out in the
current epoch. Use it as `DataLoader(dataset, batch_sampler=sampler,
generator=torch.Generator())` with `num_workers=0` (or index the dataset yourself):
worker prefetching would hand out batches before training consumes them, and
without a generator of its own the DataLoader draws from torch's global RNG each
time it makes an iterator, which after a resume shifts dropout. With workers, use
ResumableLoader (agents/checkpoint/loader.py) instead.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


class ResumableSampler:
    def __init__(self, dataset_len: int, batch_size: int, *, seed: int = 0, shuffle: bool = True,
                 drop_last: bool = True, rank: int = 0, world_size: int = 1):
        if dataset_len <= 0 or batch_size <= 0:
            raise ValueError(f"ResumableSampler needs dataset_len > 0 and batch_size > 0, got {dataset_len}, {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"ResumableSampler: rank {rank} is outside world_size {world_size}")
        self.dataset_len = dataset_len
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.position = 0

    def _epoch_indices(self) -> list[int]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.dataset_len, generator=g).tolist()
        else:
            order = list(range(self.dataset_len))
        return order[self.rank :: self.world_size]

    def batches_per_epoch(self) -> int:
        per_rank = len(range(self.rank, self.dataset_len, self.world_size))
        return per_rank // self.batch_size if self.drop_last else -(-per_rank // self.batch_size)

    def next_batch(self) -> list[int]:
        """The next batch of indices; moves to the next epoch when this one is used up."""
        if self.position >= self.batches_per_epoch():
            self.epoch += 1
            self.position = 0
        indices = self._epoch_indices()
        start = self.position * self.batch_size
        self.position += 1
        return indices[start : start + self.batch_size]

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            yield self.next_batch()

    def __len__(self) -> int:
        return self.batches_per_epoch()

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "dataset_len": self.dataset_len, "batch_size": self.batch_size, "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        for name in ("seed", "dataset_len", "batch_size", "world_size"):
            if state[name] != getattr(self, name):
                raise ValueError(f"sampler state was saved with {name}={state[name]}, this sampler has {getattr(self, name)}")
        self.epoch = state["epoch"]
        self.position = state["position"]
