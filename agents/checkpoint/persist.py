"""Phase two of a save: write the snapshot buffers to their data files, in parallel.

Periodic persists are paced: each file's writer spreads its bytes over the time
budget it is given and runs at the lowest CPU priority, because on a 2-core VM
an unpaced writer (page-cache copies + writeback) halves training speed. A notice
persist runs unpaced at normal priority. Either can be cancelled between chunks
(a notice abandoning a periodic persist) or stopped by a deadline; the files of
an unfinished persist are aborted, so nothing half-written is ever named by a
manifest.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from .manifest import FileEntry, new_digest
from .storage import Storage

CHUNK_BYTES = 8 << 20
LOWEST_PRIORITY = 19
PACE_NAP_S = 0.05


class PersistCancelled(Exception):
    """The persist was abandoned (a notice took over) or ran past its deadline."""


@dataclass
class Pace:
    """How a persist may use the machine: finish by `finish_by` (monotonic time) at an
    even rate, or as fast as possible when None; `deadline` aborts past it."""

    finish_by: float | None = None
    deadline: float | None = None
    low_priority: bool = False


def lower_priority() -> None:
    # Linux applies nice values per thread; a writer thread can deprioritise itself.
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOWEST_PRIORITY)
    except OSError:
        pass


def _wait_for_turn(pace: Pace, cancel: threading.Event, start: float, done: float, where: str) -> None:
    """Sleep until `done` (a fraction) of the file is due under the pace. Short naps,
    so a notice that unpaces or cancels the persist takes effect at once."""
    while True:
        if cancel.is_set():
            raise PersistCancelled(f"persist of {where} abandoned")
        now = time.monotonic()
        if pace.deadline is not None and now > pace.deadline:
            raise PersistCancelled(f"persist of {where} ran past its deadline")
        finish_by = pace.finish_by
        due = start if finish_by is None else start + (finish_by - start) * done
        if due <= now:
            return
        cancel.wait(min(due - now, PACE_NAP_S))


def write_file(storage: Storage, key: str, buffer: torch.Tensor, pace: Pace, cancel: threading.Event) -> FileEntry:
    if pace.low_priority:
        lower_priority()
    data = memoryview(buffer.numpy()).cast("B") if buffer.numel() else memoryview(b"")
    total = len(data)
    digest = new_digest()
    writer = storage.open_writer(key)
    start = time.monotonic()
    try:
        for offset in range(0, total, CHUNK_BYTES):
            _wait_for_turn(pace, cancel, start, offset / total, storage.url_for(key))
            chunk = data[offset : offset + CHUNK_BYTES]
            digest.update(chunk)
            writer.write(chunk)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    return FileEntry(total, digest.hexdigest())


def write_files(storage: Storage, keys: list[str], buffers: list[torch.Tensor], pace: Pace,
                cancel: threading.Event) -> dict[str, FileEntry]:
    """Write each buffer to its key, one thread per file; any failure cancels the rest."""
    with ThreadPoolExecutor(max_workers=max(1, len(keys)), thread_name_prefix="ckpt-write") as pool:
        futures = {key: pool.submit(write_file, storage, key, buf, pace, cancel) for key, buf in zip(keys, buffers)}
        entries = {}
        try:
            for key, future in futures.items():
                entries[key] = future.result()
        except BaseException:
            cancel.set()
            raise
    return entries
