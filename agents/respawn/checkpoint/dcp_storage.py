"""`torch.distributed.checkpoint`'s file-system writer and reader over our storage layer,
so a sharded checkpoint goes wherever a job's checkpoint URI points: a local folder, a
shared mount, S3, GCS or Azure Blob. A multi-node gang on a cloud has no folder every
node sees; its bucket is that place.

DCP keeps its planner, its file layout (`__<rank>_<n>.distcp`, `.metadata`) and its
writer threads; only the file system under them changes (DCP's `FileSystemBase`, the
seam its own fsspec writer uses). Each file goes through `Storage.open_writer` (fsynced
on close locally, a completed multipart or block upload on an object store) and is
digested as it is written, so the manifest's entries cost no read-back. DCP's own
fsync is off: the writer's close is what makes a file durable, and a file object of
an object store has no descriptor to fsync."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystemBase

from . import manifest
from .storage.base import Storage, Writer


class _DigestingStream:
    """The write side DCP and `torch.save` use (write, tell, flush, close) over one of our
    writers, digesting the bytes as they pass."""

    def __init__(self, writer: Writer):
        self._writer = writer
        self._digest = manifest.new_digest()
        self._size = 0
        self._closed = False

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self._digest.update(view)
        self._writer.write(view)
        self._size += len(view)
        return len(view)

    def tell(self) -> int:
        return self._size

    def flush(self) -> None:
        pass  # durable on close, as every backend's writer is

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        if not self._closed:  # DCP closes its streams itself, inside create_stream's block
            self._closed = True
            self._writer.close()

    def abort(self) -> None:
        if not self._closed:
            self._closed = True
            self._writer.abort()

    def entry(self) -> manifest.FileEntry:
        return manifest.FileEntry(self._size, self._digest.hexdigest())


class StorageFileSystem(FileSystemBase):
    """DCP's paths as keys of `storage`; `written` holds the entry of every file written
    through it (by DCP's writer threads), by key."""

    def __init__(self, storage: Storage):
        self.storage = storage
        self.written: dict[str, manifest.FileEntry] = {}
        self._lock = threading.Lock()

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator:
        key = str(path)
        if mode == "rb":
            with self.storage.open_reader(key) as reader:
                yield reader
            return
        if mode != "wb":
            raise ValueError(f"DCP asked for {key} in mode {mode!r}; only 'rb' and 'wb' are supported")
        stream = _DigestingStream(self.storage.open_writer(key))
        try:
            yield stream
        except BaseException:
            stream.abort()  # a failed save leaves no object behind, only the manifest-less folder
            raise
        stream.close()
        with self._lock:
            self.written[key] = stream.entry()

    def concat_path(self, path: str | os.PathLike, suffix: str) -> str:
        return f"{path}/{suffix}"

    def init_path(self, path: str | os.PathLike) -> str:
        return str(path)

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        # Only DCP's small .metadata is renamed (written as .metadata.tmp first).
        data = self.storage.read(str(path))
        self.storage.write_atomic(str(new_path), data)
        self.storage.delete_prefix(str(path))
        with self._lock:
            self.written[str(new_path)] = self.written.pop(str(path), None) or manifest.FileEntry(
                len(data), manifest.digest_bytes(data))

    def mkdir(self, path: str | os.PathLike) -> None:
        pass  # keys need no folders; a local writer makes its own

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return True

    def exists(self, path: str | os.PathLike) -> bool:
        return self.storage.exists(str(path))

    def rm_file(self, path: str | os.PathLike) -> None:
        self.storage.delete_prefix(str(path))

    def ls(self, path: str | os.PathLike) -> list[str]:
        return self.storage.list(str(path))


class StorageWriter(FileSystemWriter):
    """DCP's writer of the checkpoint folder `key` of `storage`."""

    def __init__(self, storage: Storage, key: str, *, thread_count: int = 1):
        super().__init__(key, sync_files=False, thread_count=thread_count)
        self.fs = StorageFileSystem(storage)
        self.path = key

    def entries(self) -> dict[str, manifest.FileEntry]:
        """The files this process wrote, by name within the folder."""
        return {key.removeprefix(f"{self.path}/"): entry for key, entry in self.fs.written.items()}


class StorageReader(FileSystemReader):
    """DCP's reader of the checkpoint folder `key` of `storage`."""

    def __init__(self, storage: Storage, key: str):
        super().__init__(key)
        self.fs = StorageFileSystem(storage)
        self.path = key
