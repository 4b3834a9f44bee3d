"""Phase one of a save: copy the state's tensors into reused host buffers.

The tensors are packed into `num_files` data files (balanced by size, each tensor
64-byte aligned). Most of each file's bytes are copied into a host buffer (pinned
when the state has CUDA tensors, so device-to-host copies run at full speed and
asynchronously), allocated once and reused while the state's layout stays the same;
the persist phase then writes it.

CUDA tensors are copied on a side stream of their device, after the work training's
current stream had queued when the save was asked. The training stream runs on beside
the copies: before its next kernel it waits (on the GPU; the host goes on) only for
the copies of the tensors a forward pass may change, and before the optimizer's update
for the rest, which only the optimizer writes (`DeviceCopy.hold_update`). The persist
waits for them on the host before it reads the buffers (`DeviceCopy.wait`).

A file may begin with "live" tensors, which are never copied: the persist writes
them straight from the training state's own memory, before the optimizer's next
step may change them (the Checkpointer makes that step wait). That is what keeps
a save's extra host memory below the size of the state.

Each buffer starts on a page boundary both in memory and in its file, and each live
tensor sits at the same offset within a page in its file as in memory, so a local
background writer can hand their pages to the disk with direct I/O (storage/local.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ALIGN = 64
PAGE = 4096


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


def _padded(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def plan_slots(tensors: list[torch.Tensor], num_files: int,
               live: frozenset[int] = frozenset()) -> tuple[list[Slot], list[int], list[int]]:
    """Place each tensor in a file (largest first onto the least-filled file), the
    `live` ones first within their file. Returns the slots, each file's size and
    each file's live prefix (bytes)."""
    sizes = [0] * num_files
    members: list[list[int]] = [[] for _ in range(num_files)]
    for i in sorted(range(len(tensors)), key=lambda i: -_nbytes(tensors[i])):
        f = min(range(num_files), key=sizes.__getitem__)
        members[f].append(i)
        sizes[f] += _padded(_nbytes(tensors[i]))
    slots: list[Slot | None] = [None] * len(tensors)
    live_ends = [0] * num_files
    for f, indices in enumerate(members):
        offset = 0
        for group in ([i for i in indices if i in live], [i for i in indices if i not in live]):
            offset = live_ends[f] = -(-offset // PAGE) * PAGE  # the buffer starts on a page
            for i in group:
                t = tensors[i]
                if i in live:  # same offset within a page in memory and in the file: direct I/O can take it
                    offset += (t.data_ptr() - offset) % PAGE
                slots[i] = Slot(f, offset, _nbytes(t), t.dtype, tuple(t.shape))
                offset += _padded(_nbytes(t))
        sizes[f] = offset
    return slots, sizes, live_ends


def raw_bytes(t: torch.Tensor) -> memoryview:
    """A contiguous CPU tensor's bytes, without a copy."""
    return memoryview(t.detach().reshape(-1).view(torch.uint8).numpy()).cast("B")


@dataclass
class FileSource:
    """A data file's bytes in order: `live` (views of the training state's own tensors
    and the zero padding between them), then `buffer` (the copied rest)."""

    live: list[memoryview]
    buffer: memoryview

    @property
    def nbytes(self) -> int:
        return sum(len(v) for v in self.live) + len(self.buffer)


@dataclass
class DeviceCopy:
    """Copies of CUDA tensors into the host buffers, queued on side streams: `done` holds
    each device's event recorded after the last of them."""

    done: list[tuple[torch.device, torch.cuda.Event]]
    update_held: bool = False

    def hold_update(self) -> None:
        """Called right before the optimizer's step: its kernels, queued on the current
        streams from here on, wait for the copies on the GPU; the host does not."""
        if not self.update_held:
            for device, event in self.done:
                torch.cuda.current_stream(device).wait_event(event)
            self.update_held = True

    def wait(self) -> None:
        """Return once the buffers hold every copy."""
        for _, event in self.done:
            event.synchronize()


class SnapshotBuffers:
    """Reused host buffers for one process's share of the state."""

    def __init__(self, num_files: int):
        self.num_files = num_files
        self._signature: tuple | None = None
        self.slots: list[Slot] = []
        self.live: frozenset[int] = frozenset()
        self.live_ends: list[int] = []
        self.buffers: list[torch.Tensor] = []
        self.views: list[torch.Tensor | None] = []  # None for a live tensor
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    @property
    def nbytes(self) -> int:
        return sum(b.numel() for b in self.buffers)

    def _allocate(self, tensors: list[torch.Tensor], live: frozenset[int], signature: tuple) -> None:
        self.slots, sizes, self.live_ends = plan_slots(tensors, self.num_files, live)
        self.live = live
        pinned = any(t.is_cuda for t in tensors)
        self.buffers = [_page_aligned(size - start, pinned) for size, start in zip(sizes, self.live_ends)]
        self.views = [None if i in live else view_of(self.buffers[s.file], s, self.live_ends[s.file])
                      for i, s in enumerate(self.slots)]
        self._signature = signature

    def copy_in(self, tensors: list[torch.Tensor], skip: frozenset[int] = frozenset(),
                live: frozenset[int] = frozenset()) -> tuple[list[int], DeviceCopy | None]:
        """Copy every tensor but the `live` ones (written from the state itself) and
        those at the `skip` indices (only the optimizer writes them). A skipped CPU
        tensor is copied later by `copy_some`, a CUDA one on the side stream behind the
        others. Returns the CPU indices still to copy and the CUDA copies in flight
        (None without CUDA tensors), which the caller must wait for before the
        optimizer's step (`hold_update`) and before the buffers are read (`wait`). A
        layout or live set unlike the last one re-plans."""
        signature = (tuple((t.dtype, tuple(t.shape), t.is_cuda) for t in tensors), live)
        if signature != self._signature:
            self._allocate(tensors, live, signature)
        wanted = [i for i in range(len(tensors)) if self.views[i] is not None and self.views[i].numel()]
        self.copy_some(tensors, [i for i in wanted if i not in skip and not tensors[i].is_cuda])
        device = self._copy_from_devices(tensors, [i for i in wanted if i not in skip and tensors[i].is_cuda],
                                         [i for i in wanted if i in skip and tensors[i].is_cuda])
        return [i for i in wanted if i in skip and not tensors[i].is_cuda], device

    def copy_some(self, tensors: list[torch.Tensor], indices: list[int]) -> None:
        """Copy the CPU tensors at `indices`."""
        for i in indices:
            if self.views[i] is not None and self.views[i].numel():
                self.views[i].copy_(tensors[i])

    def _copy_from_devices(self, tensors: list[torch.Tensor], now: list[int], later: list[int]) -> DeviceCopy | None:
        """Queue the copies of `now`, then `later`, on each device's side stream. The
        current stream waits for `now` before its next kernel: a forward pass may change
        those (batch-norm statistics). The tensors must stay alive until `wait()`
        returns, the caller keeping them: the allocator knows nothing of the side
        stream's reads."""
        if not now and not later:
            return None
        done = []
        for device in dict.fromkeys(tensors[i].device for i in now + later):
            if device not in self._streams:
                self._streams[device] = torch.cuda.Stream(device)
            stream, training = self._streams[device], torch.cuda.current_stream(device)
            stream.wait_stream(training)
            with torch.cuda.stream(stream):
                for i in now:
                    if tensors[i].device == device:
                        self.views[i].copy_(tensors[i], non_blocking=True)
                training.wait_event(stream.record_event())
                for i in later:
                    if tensors[i].device == device:
                        self.views[i].copy_(tensors[i], non_blocking=True)
                # Blocking: `wait()` sleeps in the persist thread instead of spinning a core.
                done.append((device, stream.record_event(torch.cuda.Event(blocking=True))))
        return DeviceCopy(done)

    def sources(self, tensors: list[torch.Tensor]) -> list[FileSource]:
        """Each file's bytes: its live tensors (the state's memory) then its buffer."""
        live: list[list[memoryview]] = [[] for _ in range(self.num_files)]
        ends = [0] * self.num_files
        for i in sorted(self.live, key=lambda i: self.slots[i].offset):
            slot = self.slots[i]
            live[slot.file] += [_zeros(slot.offset - ends[slot.file]), raw_bytes(tensors[i])]
            ends[slot.file] = slot.offset + slot.nbytes
        for f, end in enumerate(ends):
            live[f].append(_zeros(self.live_ends[f] - end))
        return [FileSource(views, memoryview(b.numpy()).cast("B") if b.numel() else memoryview(b""))
                for views, b in zip(live, self.buffers)]


def _zeros(n: int) -> memoryview:
    return memoryview(bytes(n))


def _page_aligned(nbytes: int, pinned: bool = False) -> torch.Tensor:
    """A host buffer starting on a page boundary. A pinned one comes from torch's host
    allocator, which rounds each block up to a power of two: up to twice `nbytes`."""
    raw = torch.empty(nbytes + PAGE, dtype=torch.uint8, pin_memory=pinned)
    start = -raw.data_ptr() % PAGE
    return raw[start : start + nbytes]


def view_of(buffer: torch.Tensor, slot: Slot, base: int = 0) -> torch.Tensor:
    """The tensor `slot` describes, as a view into `buffer` (a flat uint8 tensor that
    holds its file's bytes from offset `base` on)."""
    if slot.nbytes == 0:
        return torch.empty(slot.shape, dtype=slot.dtype)
    raw = buffer[slot.offset - base : slot.offset - base + slot.nbytes]
    return raw.view(slot.dtype).view(slot.shape)
