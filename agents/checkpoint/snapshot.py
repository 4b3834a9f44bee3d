"""Phase one of a save: copy every tensor of the state into reused host buffers.

The tensors are packed into `num_files` byte buffers (one per data file, balanced
by size, each tensor 64-byte aligned) so the persist phase writes each buffer
straight to its file. Buffers are allocated once and reused while the state's
layout stays the same (pinned on CUDA so device-to-host copies run at full speed).
The Checkpointer copies the tensors only the optimizer writes (weights, moments)
beside the next step's forward/backward; the rest is copied at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ALIGN = 64


@dataclass(frozen=True)
class Slot:
    file: int
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]

    def to_json(self) -> dict:
        return {"file": self.file, "offset": self.offset, "nbytes": self.nbytes,
                "dtype": str(self.dtype).removeprefix("torch."), "shape": list(self.shape)}

    @classmethod
    def from_json(cls, d: dict) -> "Slot":
        return cls(d["file"], d["offset"], d["nbytes"], getattr(torch, d["dtype"]), tuple(d["shape"]))


def _signature(tensors: list[torch.Tensor]) -> tuple:
    return tuple((t.dtype, tuple(t.shape)) for t in tensors)


def plan_slots(tensors: list[torch.Tensor], num_files: int) -> tuple[list[Slot], list[int]]:
    """Place each tensor in a file (largest first onto the least-filled file)."""
    sizes = [0] * num_files
    slots: list[Slot | None] = [None] * len(tensors)
    order = sorted(range(len(tensors)), key=lambda i: -tensors[i].numel() * tensors[i].element_size())
    for i in order:
        t = tensors[i]
        nbytes = t.numel() * t.element_size()
        f = min(range(num_files), key=sizes.__getitem__)
        slots[i] = Slot(f, sizes[f], nbytes, t.dtype, tuple(t.shape))
        sizes[f] += -(-nbytes // ALIGN) * ALIGN
    return slots, sizes


class SnapshotBuffers:
    """Reused host buffers for one process's share of the state."""

    def __init__(self, num_files: int):
        self.num_files = num_files
        self._signature: tuple | None = None
        self.slots: list[Slot] = []
        self.buffers: list[torch.Tensor] = []
        self.views: list[torch.Tensor] = []

    @property
    def nbytes(self) -> int:
        return sum(b.numel() for b in self.buffers)

    def _allocate(self, tensors: list[torch.Tensor]) -> None:
        self.slots, sizes = plan_slots(tensors, self.num_files)
        pin = torch.cuda.is_available()
        self.buffers = [torch.empty(size, dtype=torch.uint8, pin_memory=pin) for size in sizes]
        self.views = [view_of(self.buffers[s.file], s) for s in self.slots]
        self._signature = _signature(tensors)

    def copy_in(self, tensors: list[torch.Tensor], skip: frozenset[int] = frozenset()) -> list[int]:
        """Copy every tensor but those at the `skip` indices (copied later by
        `copy_some`); returns the skipped indices that hold bytes."""
        if _signature(tensors) != self._signature:
            self._allocate(tensors)
        self.copy_some(tensors, [i for i in range(len(tensors)) if i not in skip])
        return [i for i in sorted(skip) if self.views[i].numel()]

    def copy_some(self, tensors: list[torch.Tensor], indices: list[int]) -> None:
        for i in indices:
            if self.views[i].numel():
                self.views[i].copy_(tensors[i], non_blocking=tensors[i].is_cuda)
        if any(tensors[i].is_cuda for i in indices):
            torch.cuda.synchronize()


def view_of(buffer: torch.Tensor, slot: Slot) -> torch.Tensor:
    """The tensor `slot` describes, as a view into `buffer` (a flat uint8 tensor)."""
    if slot.nbytes == 0:
        return torch.empty(slot.shape, dtype=slot.dtype)
    raw = buffer[slot.offset : slot.offset + slot.nbytes]
    return raw.view(slot.dtype).view(slot.shape)
