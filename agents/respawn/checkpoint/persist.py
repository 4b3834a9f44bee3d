"""Phase two of a save: write each data file, the files in parallel.

A file's live part (tensors written straight from the training state) goes first,
at full speed and normal priority, since the optimizer's next step waits for it;
then its snapshot buffer. Periodic persists are paced: each file's writer spreads its bytes over the time
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
from dataclasses import dataclass, field

from .manifest import FileEntry, new_digest
from .snapshot import FileSource
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
    timings: list[tuple[float, float]] = field(default_factory=list)
    """(seconds it took, seconds of them it waited for its turn) of each written file,
    appended as it finishes: what the pace added to the persist (see `unpaced_s`)."""

    def unpaced_s(self, took_s: float) -> float:
        """What a persist that took `took_s` under this pace would take unpaced: its
        files write side by side, so the slowest one's time is replaced by the longest
        any took without its waits. An upper estimate: a paced writer also ran at the
        lowest priority, beside training."""
        if not self.timings:
            return took_s
        return took_s - max(t for t, _ in self.timings) + max(t - waited for t, waited in self.timings)


def lower_priority() -> None:
    """Make the calling thread yield to training. Linux schedules threads one by one:
    SCHED_IDLE runs it only on an otherwise idle core and gives way at once when a
    training thread wakes (a nice-19 thread still takes a slice of a busy core, and
    every such slice stalls the OpenMP barrier of a 2-thread training step); where
    that policy is missing, the lowest nice value."""
    tid = threading.get_native_id()
    try:
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        try:
            os.setpriority(os.PRIO_PROCESS, tid, LOWEST_PRIORITY)
        except OSError:
            pass


def _check(pace: Pace, cancel: threading.Event, where: str) -> None:
    if cancel.is_set():
        raise PersistCancelled(f"persist of {where} abandoned")
    if pace.deadline is not None and time.monotonic() > pace.deadline:
        raise PersistCancelled(f"persist of {where} ran past its deadline")


def _wait_for_turn(pace: Pace, cancel: threading.Event, start: float, done: float, where: str) -> float:
    """Sleep until `done` (a fraction) of the file is due under the pace; returns the
    seconds slept. Short naps, so a notice that unpaces or cancels the persist takes
    effect at once."""
    began = time.monotonic()
    while True:
        _check(pace, cancel, where)
        now = time.monotonic()
        finish_by = pace.finish_by
        due = start if finish_by is None else start + (finish_by - start) * done
        if due <= now:
            return now - began
        cancel.wait(min(due - now, PACE_NAP_S))


def write_file(storage: Storage, key: str, source: FileSource, pace: Pace, cancel: threading.Event,
               live_written: threading.Event, buffer_ready: threading.Event) -> FileEntry:
    """Write the file's live part at full speed (the optimizer waits for it) and set
    `live_written`; then, once `buffer_ready`, its buffer under the pace."""
    where = storage.url_for(key)
    digest = new_digest()
    writer, began = None, time.monotonic()
    try:
        writer = storage.open_writer(key, background=pace.low_priority)
        for view in source.live:
            for offset in range(0, len(view), CHUNK_BYTES):
                _check(pace, cancel, where)
                chunk = view[offset : offset + CHUNK_BYTES]
                digest.update(chunk)
                writer.write(chunk)
        live_written.set()
        buffer_ready.wait()
        if pace.low_priority:
            lower_priority()
        data, start, waited = source.buffer, time.monotonic(), 0.0
        for offset in range(0, len(data), CHUNK_BYTES):
            waited += _wait_for_turn(pace, cancel, start, offset / len(data), where)
            chunk = data[offset : offset + CHUNK_BYTES]
            digest.update(chunk)
            writer.write(chunk)
        writer.close()
        pace.timings.append((time.monotonic() - began, waited))
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        live_written.set()
    return FileEntry(source.nbytes, digest.hexdigest())


def write_files(storage: Storage, keys: list[str], sources: list[FileSource], pace: Pace, cancel: threading.Event,
                complete_snapshot=lambda: None, release_live=lambda: None) -> dict[str, FileEntry]:
    """Write each source to its key, one thread per file; any failure cancels the rest.

    While the files' live parts are written, this thread runs `complete_snapshot`
    (copying what the buffers still lack); the buffers are written after it, and
    `release_live` runs once no file reads the live tensors any more (or none will)."""
    live_written = [threading.Event() for _ in keys]
    buffer_ready = threading.Event()
    with ThreadPoolExecutor(max_workers=max(1, len(keys)), thread_name_prefix="ckpt-write") as pool:
        futures = {key: pool.submit(write_file, storage, key, source, pace, cancel, written, buffer_ready)
                   for key, source, written in zip(keys, sources, live_written)}
        try:
            try:
                complete_snapshot()
            except BaseException:
                cancel.set()  # before the buffers' writes start
                raise
            finally:
                buffer_ready.set()
                for written in live_written:
                    written.wait()
                release_live()
            entries = {key: future.result() for key, future in futures.items()}
        except BaseException:
            cancel.set()
            raise
    return entries
