"""A batch sampler that remembers where it is, so resume neither repeats nor skips a sample.

Each epoch is a permutation drawn from `seed + epoch` (independent of the global
RNG), cut into global batches of `batch_size x world_size` samples; rank r takes the
r-th `batch_size` of each. `position` counts global batches already handed out in
the current epoch, so it means the same on any world size: a checkpoint resumes on
another world size with the same global sample order as long as the global batch
is the same (4 ranks x 8 -> 2 ranks x 16); another global batch is refused. Use it as `DataLoader(dataset, batch_sampler=sampler,
generator=torch.Generator())` with `num_workers=0` (or index the dataset yourself):
worker prefetching would hand out batches before training consumes them, and
without a generator of its own the DataLoader draws from torch's global RNG each
time it makes an iterator, which after a resume shifts dropout. With workers, use
ResumableLoader (agents/respawn/checkpoint/loader.py) instead.
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

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    def _epoch_indices(self) -> list[int]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            return torch.randperm(self.dataset_len, generator=g).tolist()
        return list(range(self.dataset_len))

    def batches_per_epoch(self) -> int:
        whole, rest = divmod(self.dataset_len, self.global_batch)
        return whole + int(bool(rest) and not self.drop_last)

    def next_batch(self) -> list[int]:
        """The next batch of indices; moves to the next epoch when this one is used up."""
        if self.position >= self.batches_per_epoch():
            self.epoch += 1
            self.position = 0
        start = self.position * self.global_batch + self.rank * self.batch_size
        self.position += 1
        return self._epoch_indices()[start : start + self.batch_size]

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            yield self.next_batch()

    def __len__(self) -> int:
        return self.batches_per_epoch()

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "dataset_len": self.dataset_len, "batch_size": self.batch_size, "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        for name in ("seed", "dataset_len"):
            if state[name] != getattr(self, name):
                raise ValueError(f"sampler state was saved with {name}={state[name]}, this sampler has {getattr(self, name)}")
        saved_global = state["batch_size"] * state["world_size"]
        if saved_global != self.global_batch:
            raise ValueError(
                f"sampler state was saved by {state['world_size']} ranks x batch {state['batch_size']} (global batch "
                f"{saved_global}); this run has {self.world_size} ranks x batch {self.batch_size} = {self.global_batch}: "
                f"resume on a world size that divides {saved_global}, with batch_size {saved_global} / world size")
        self.epoch = state["epoch"]
        self.position = state["position"]
