"""What the object-store backends (S3, GCS, Azure Blob) share.

- `ObjectRoot`: a `scheme://bucket/prefix` URI, and the mapping between our keys
  and object names, with the same key rules and directory-like prefix semantics
  as the local backend (`list("job-7")` never returns `job-70/...`).
- `ObjectStorage`: the calls every object-store backend answers from its root and
  its `size` alone (`exists`, `url_for`).
- `PartedWriter`: one object uploaded as numbered parts in parallel threads and
  made visible only by the final commit in `close()`; the backends supply the
  four calls (start, upload part, complete, abort).
- `open_ranged_reader`: a seekable, buffered reader over ranged GETs, so that
  `torch.load` and digest checks can stream an object without holding it twice.
"""

from __future__ import annotations

import io
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable
from urllib.parse import urlparse

from .base import StorageError

MIB = 1024 * 1024


class MissingObjectError(StorageError):
    """The key names no object (the message says which)."""


@dataclass(frozen=True, slots=True)
class ObjectRoot:
    uri: str  # as given, without a trailing slash
    bucket: str  # bucket (S3, GCS) or container (Azure)
    prefix: str  # "" or "some/prefix/" (always ends with a slash)

    @classmethod
    def parse(cls, uri: str, scheme: str) -> ObjectRoot:
        parsed = urlparse(uri)
        if parsed.scheme != scheme:
            raise StorageError(f"{uri!r} is not a {scheme}:// URI")
        if not parsed.netloc:
            raise StorageError(f"{uri!r} names no bucket: expected {scheme}://BUCKET[/PREFIX]")
        if parsed.query or parsed.fragment:
            raise StorageError(f"{uri!r}: query strings and fragments are not part of a {scheme}:// root")
        prefix = parsed.path.strip("/")
        if prefix:
            check_key(prefix, uri)
        return cls(uri=uri.rstrip("/"), bucket=parsed.netloc, prefix=f"{prefix}/" if prefix else "")

    def object_name(self, key: str) -> str:
        check_key(key, self.uri)
        return self.prefix + key

    def list_prefix(self, prefix: str) -> str:
        """The object-name prefix that `list(prefix)` / `delete_prefix(prefix)` scan."""
        return self.object_name(prefix.rstrip("/")) if prefix.strip("/") else self.prefix

    def keys_under(self, prefix: str, names: list[str]) -> list[str]:
        """Keys of `names` (from a listing of `list_prefix(prefix)`) that lie under
        `prefix` as a directory, or name exactly `prefix` itself, sorted."""
        scanned = self.list_prefix(prefix)
        if scanned == self.prefix:
            chosen = names
        else:
            chosen = [n for n in names if n == scanned or n.startswith(scanned + "/")]
        return sorted(n[len(self.prefix) :] for n in chosen)

    def url_for(self, key: str) -> str:
        return f"{self.uri}/{key}" if key else self.uri


class ObjectStorage:
    """Base of the object-store backends: each keeps its root in `_root`, and its `size`
    raises MissingObjectError for a key that names no object."""

    _root: ObjectRoot

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except MissingObjectError:
            return False
        return True

    def url_for(self, key: str) -> str:
        return self._root.url_for(key)


def check_key(key: str, uri: str) -> None:
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise StorageError(f"key {key!r} is not a valid key under {uri}: use '/'-separated names without '.', '..' or empty parts")


@dataclass(frozen=True, slots=True, kw_only=True)
class PartedUploadConfig:
    """How one large object is split and uploaded."""

    part_size: int = 8 * MIB
    """Bytes per part (the first 1000 parts; see `PartedWriter`). S3 refuses parts under 5 MiB."""
    max_concurrency: int = 8
    """Parts uploading at once per writer; also bounds the writer's memory to
    (max_concurrency + 1) * part_size."""

    def __post_init__(self) -> None:
        if self.part_size < 5 * MIB:
            raise ValueError(f"part_size={self.part_size} is below 5 MiB, the smallest part S3 accepts; use at least {5 * MIB}")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency={self.max_concurrency} must be at least 1")


# Both S3 (10,000 parts) and Azure (50,000 blocks) cap the part count, and a
# writer does not know the object's size in advance, so parts grow: part n is
# part_size * (1 + (n - 1) // PARTS_PER_SIZE_STEP). With 8 MiB that is 8 MiB for
# the first 1000 parts and ~430 GiB within S3's 10,000 parts.
PARTS_PER_SIZE_STEP = 1000


class PartedWriter:
    """A `Writer` that uploads numbered parts in parallel and commits on `close()`.

    Nothing is visible until `_complete` runs; a failed part, `abort()`, or a
    writer dropped without `close()` never commits. Objects smaller than one
    part skip the multipart machinery and are written with one PUT on close.
    """

    max_parts: int  # the service's limit

    def __init__(self, url: str, config: PartedUploadConfig):
        self.url = url
        self._config = config
        self._buffer = bytearray()
        self._next_part = 1
        self._pending: dict[int, Future] = {}  # part number -> upload in flight
        self._tokens: dict[int, Any] = {}  # part number -> what _upload_part returned
        self._pool: ThreadPoolExecutor | None = None
        self._started = False
        self._state = "open"

    # --- the backend's four calls; each raises StorageError ---
    def _start(self) -> None:
        raise NotImplementedError

    def _upload_part(self, number: int, data: bytearray) -> Any:
        """Upload one part; returns what `_complete` needs to name it."""
        raise NotImplementedError

    def _complete(self, tokens: list[Any]) -> None:
        raise NotImplementedError

    def _abort(self) -> None:
        raise NotImplementedError

    def _put_whole(self, data: bytearray) -> None:
        raise NotImplementedError

    # --- Writer ---
    def write(self, data: bytes | memoryview) -> int:
        self._check_open()
        view = memoryview(data).cast("B")
        taken = 0
        try:
            while taken < len(view):
                room = self._current_part_size() - len(self._buffer)
                self._buffer += view[taken : taken + room]
                taken += min(room, len(view) - taken)
                if len(self._buffer) == self._current_part_size():
                    self._submit_part()
        except BaseException:
            self._abort_after_failure()
            raise
        return taken

    def close(self) -> None:
        self._check_open()
        try:
            if not self._started:
                self._put_whole(self._buffer)
            else:
                if self._buffer:
                    self._submit_part()
                self._collect(wait_all=True)
                self._complete([token for _, token in sorted(self._tokens.items())])
        except BaseException:
            self._abort_after_failure()
            raise
        self._state = "closed"
        self._release()

    def abort(self) -> None:
        """Discard the upload. A no-op after a successful `close()`: the object
        is committed by then, and deleting it is `delete_prefix`'s job."""
        self._discard(wait_for_parts=True)

    def _abort_after_failure(self) -> None:
        # The caller needs the error that broke the upload, not a failed abort
        # (the upload is invisible either way).
        try:
            self.abort()
        except StorageError:
            pass

    def __del__(self) -> None:
        # A writer dropped mid-stream (its thread died) never commits; this only
        # spares the service a pending upload. No waiting: the last reference may
        # go away inside one of the writer's own part threads.
        try:
            self._discard(wait_for_parts=False)
        except Exception:
            pass

    def _discard(self, wait_for_parts: bool) -> None:
        if self._state != "open":
            return
        self._state = "aborted"
        if self._pool is not None:
            # Parts still uploading when the upload is aborted could be stored
            # after it, so a normal abort lets them finish first.
            self._pool.shutdown(wait=wait_for_parts, cancel_futures=True)
        if self._started:
            self._abort()
        self._release()

    # --- internals ---
    def _check_open(self) -> None:
        if self._state != "open":
            raise StorageError(f"{self.url}: writer is already {self._state}")

    def _current_part_size(self) -> int:
        return self._config.part_size * (1 + (self._next_part - 1) // PARTS_PER_SIZE_STEP)

    def _submit_part(self) -> None:
        if self._next_part > self.max_parts:
            raise StorageError(f"{self.url}: object exceeds {self.max_parts} parts; raise part_size (now {self._config.part_size})")
        if not self._started:
            self._pool = ThreadPoolExecutor(self._config.max_concurrency, thread_name_prefix="storage-part")
            self._start()
            self._started = True
        self._collect(wait_all=False)
        number, data = self._next_part, self._buffer
        self._pending[number] = self._pool.submit(self._upload_part, number, data)
        self._next_part += 1
        self._buffer = bytearray()

    def _collect(self, wait_all: bool) -> None:
        """Wait until fewer than max_concurrency parts are in flight (bounding
        memory), or none when `wait_all`; raise the first failed part's error."""
        limit = 1 if wait_all else self._config.max_concurrency
        while True:
            for number, future in list(self._pending.items()):
                if future.done():
                    self._tokens[number] = future.result()
                    del self._pending[number]
            if len(self._pending) < limit:
                return
            wait(self._pending.values(), return_when=FIRST_COMPLETED)

    def _release(self) -> None:
        self._buffer = bytearray()
        self._pending, self._tokens = {}, {}
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


class _RangedRaw(io.RawIOBase):
    def __init__(self, size: int, fetch: Callable[[int, int], bytes]):
        self._size = size
        self._fetch = fetch
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer) -> int:
        wanted = min(len(buffer), self._size - self._pos)
        if wanted <= 0:
            return 0
        data = self._fetch(self._pos, wanted)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def readall(self) -> bytes:
        # The default reads 8 KiB at a time: one request each.
        if self._pos >= self._size:
            return b""
        data = self._fetch(self._pos, self._size - self._pos)
        self._pos += len(data)
        return data


def open_ranged_reader(size: int, fetch: Callable[[int, int], bytes], buffer_size: int = 8 * MIB) -> BinaryIO:
    """A seekable reader of an object of `size` bytes; `fetch(offset, length)`
    returns those bytes (one ranged GET)."""
    return io.BufferedReader(_RangedRaw(size, fetch), buffer_size=buffer_size)
