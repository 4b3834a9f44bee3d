"""ResumableLoader: a DataLoader with worker processes that resumes exactly (DESIGN §6).

It is torchdata's `StatefulDataLoader` (a drop-in `torch.utils.data.DataLoader` whose
`state_dict()` counts what the training loop has *received*, not what the workers
prefetched, and records each worker's dataset state), with two things added:

- Its own generator, re-seeded from `seed + epoch` at the start of each epoch, so the
  shuffle order and the workers' base seed of an epoch depend on nothing else: not on
  how many epochs this process has run, nor on a resume in between.
- It never draws from torch's global RNG. A plain DataLoader draws its workers' base
  seed from the global RNG each time its iterator is created; when that happens after
  `load_latest()` restored the RNG (always, after a resume), the draw shifts every
  random number the model takes afterwards, and dropout differs from the uninterrupted
  run. Here the iterator is created, and the state taken, inside `fork_rng`.

Put it in the TrainState (`TrainState(model, optimizer, loader=loader)`): its state is
saved with every checkpoint and restored by `load_latest()`. Map-style datasets need
nothing more; an IterableDataset resumes exactly when it shards itself by
`torch.utils.data.get_worker_info()` and has `state_dict()` / `load_state_dict()` giving
its position (each worker's copy is saved and restored). Randomness inside workers
(augmentation) must come from the sample (its index, the epoch) or from the dataset's
own state: a worker's RNG is re-seeded, not restored, when a run resumes mid-epoch.

torchdata is imported here, never by the agent (agents/respawn/checkpoint/__init__.py loads
this module on first use of ResumableLoader).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from .errors import ConfigError


class ResumableLoader(StatefulDataLoader):
    """`ResumableLoader(dataset, batch_size, seed=0, shuffle=..., num_workers=..., ...)`:
    any DataLoader argument but `generator`. `epoch` is the epoch being iterated; each
    `iter(loader)` after the first starts the next one."""

    def __init__(self, dataset, batch_size: int | None = 1, *, seed: int = 0, **kwargs: Any):
        if kwargs.get("generator") is not None:
            raise ConfigError("ResumableLoader seeds its own generator from seed= (per epoch); pass seed, not generator")
        self.seed = seed
        self.epoch = 0
        self._iterated = False  # an iterator of `epoch` was handed out: the next iter() starts epoch + 1
        with warnings.catch_warnings():  # torchdata 0.11 calls torch.set_vital, deprecated since; nothing to act on
            warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
            super().__init__(dataset, batch_size, generator=torch.Generator(), **kwargs)

    def __iter__(self):
        with torch.random.fork_rng(devices=[]):
            if self._iterated:
                self.epoch += 1
            self._iterated = True
            if self.next_iter_state is None and not self._initial_iter_for_state_dict:
                self.generator.manual_seed(self.seed + self.epoch)
            return super().__iter__()

    def state_dict(self) -> dict:
        with torch.random.fork_rng(devices=[]):
            if self._iterator is None and self.next_iter_state is None:
                self.generator.manual_seed(self.seed + self.epoch)  # the iterator made for it is this epoch's
            return {**self._shape(), "epoch": self.epoch, "loader": super().state_dict()}

    def _shape(self) -> dict:
        return {"seed": self.seed, "batch_size": self.batch_size, "num_workers": self.num_workers}

    def load_state_dict(self, state: dict) -> None:
        for name, value in self._shape().items():
            if state[name] != value:
                raise ValueError(f"loader state was saved with {name}={state[name]}, this loader has {name}={value}")
        self.epoch, self._iterated = state["epoch"], False
        inner = _owned(state["loader"])
        if inner.get("_iterator_finished"):
            # The epoch was used up: the next iter() starts the following one afresh, as
            # the uninterrupted run's next iter() does.
            self.epoch, inner = self.epoch + 1, {}
        super().load_state_dict(inner)


def _owned(obj):
    """`obj` with its tensors copied: a loaded checkpoint's tensors are views into a
    shared read buffer, and a generator's set_state wants a tensor of its own."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: _owned(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_owned(v) for v in obj)
    return obj
