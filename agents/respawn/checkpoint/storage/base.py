"""The one small interface every checkpoint storage backend implements.

Keys are '/'-separated strings relative to the backend's root (the URI it was
opened with), e.g. "job-7/step-00001200/MANIFEST.json". Paths stay strings so
remote URIs survive. Commit semantics are the same on every backend:

- `open_writer(key)`: a stream for one large data file; the bytes are durable
  and visible only after `close()` returns (local: fsync; object stores: the
  multipart/block upload is completed). `abort()` discards everything written.
- `write_atomic(key, data)`: a small object (manifest, LATEST) that readers see
  either whole or not at all, durable on return (local: tmp, fsync, rename,
  fsync dir; object stores: one PUT).
- A writer killed before `close()` leaves no object, but it may leave an
  unfinished write taking space: `unfinished` lists those, `discard_unfinished`
  and `delete_prefix` remove them.
"""

from __future__ import annotations

from typing import BinaryIO, Protocol, runtime_checkable


class StorageError(Exception):
    """A storage operation failed; the message names the URI and the problem."""


class UnknownSchemeError(StorageError):
    pass


@runtime_checkable
class Writer(Protocol):
    def write(self, data: bytes | memoryview) -> int:
        """Take all of `data`. The caller may change it once this returns (it may be a
        training tensor's own memory), so a writer copies what it keeps."""
        ...

    def close(self) -> None: ...

    def abort(self) -> None: ...


@runtime_checkable
class Storage(Protocol):
    uri: str  # the root this backend was opened with, e.g. "s3://bucket/prefix"

    def open_writer(self, key: str, background: bool = False) -> Writer:
        """A writer whose object appears under `key` only on `close()`. `background`: a
        paced write beside training, where less CPU matters more than latency (local
        files then bypass the page cache); object stores upload the same either way."""
        ...

    def write_atomic(self, key: str, data: bytes) -> None: ...

    def open_reader(self, key: str) -> BinaryIO: ...

    def read(self, key: str) -> bytes: ...

    def size(self, key: str) -> int: ...

    def exists(self, key: str) -> bool: ...

    def list(self, prefix: str) -> list[str]:
        """Every key under `prefix` (recursively), sorted."""
        ...

    def delete_prefix(self, prefix: str) -> None:
        """Every object under `prefix`, and every unfinished write there (see `unfinished`)."""
        ...

    def unfinished(self, prefix: str) -> list[str]:
        """Keys under `prefix` of writes that were started and never closed or aborted:
        a writer still at work, or the leftovers of a process killed mid-write, which
        `list` never shows but which still take space (local: temp files; S3: multipart
        uploads). Backends whose unfinished uploads take no space return []."""
        ...

    def discard_unfinished(self, prefix: str) -> None:
        """Drop the unfinished writes under `prefix`, leaving finished objects alone.
        Only for a prefix no live writer can be using."""
        ...

    def url_for(self, key: str) -> str:
        """The full URI of `key` (root URI + key), for reports and logs."""
        ...
