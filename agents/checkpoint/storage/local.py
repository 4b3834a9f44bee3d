"""Local filesystem storage: the default backend, and the model the others follow.

Durability: a data file is written to a temporary name, fsynced, renamed into
place and its directory fsynced on `close()`; small objects (manifest, LATEST)
go through the same tmp + fsync + rename + fsync-dir path in `write_atomic`.
A crash therefore leaves at worst `*.tmp-*` files, which no reader looks at.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlparse

from .base import StorageError

TMP_MARKER = ".tmp-"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_dirs_durable(path: Path) -> None:
    """mkdir -p, fsyncing each parent whose entry list changed, so a new
    checkpoint directory survives a power cut together with its manifest."""
    missing = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            pass
        _fsync_dir(directory.parent)


class LocalWriter:
    """One data file; visible under its final name only after `close()`."""

    def __init__(self, final: Path):
        self._final = final
        self._tmp = final.with_name(f"{final.name}{TMP_MARKER}{uuid.uuid4().hex[:8]}")
        self._fd: int | None = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data).cast("B")
        written = 0
        while written < len(view):
            written += os.write(self._fd, view[written:])
        return written

    def close(self) -> None:
        if self._fd is None:
            return
        try:
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = None
        os.replace(self._tmp, self._final)
        _fsync_dir(self._final.parent)

    def abort(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._tmp.unlink(missing_ok=True)


class LocalStorage:
    def __init__(self, uri: str):
        parsed = urlparse(uri)
        if parsed.scheme not in ("", "file"):
            raise StorageError(f"LocalStorage cannot open {uri!r}: not a path or file:// URI")
        root = parsed.path if parsed.scheme == "file" else uri
        if not root:
            raise StorageError(f"LocalStorage needs a directory path, got {uri!r}")
        self.uri = uri.rstrip("/")
        self.root = Path(root).resolve()

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if path != self.root and self.root not in path.parents:
            raise StorageError(f"key {key!r} escapes storage root {self.uri!r}")
        return path

    def open_writer(self, key: str) -> LocalWriter:
        path = self._path(key)
        _make_dirs_durable(path.parent)
        return LocalWriter(path)

    def write_atomic(self, key: str, data: bytes) -> None:
        writer = self.open_writer(key)
        try:
            writer.write(data)
        except BaseException:
            writer.abort()
            raise
        writer.close()

    def open_reader(self, key: str) -> BinaryIO:
        try:
            return open(self._path(key), "rb")
        except FileNotFoundError:
            raise StorageError(f"{self.url_for(key)} does not exist") from None

    def read(self, key: str) -> bytes:
        with self.open_reader(key) as f:
            return f.read()

    def size(self, key: str) -> int:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            raise StorageError(f"{self.url_for(key)} does not exist") from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix) if prefix else self.root
        if base.is_file():
            return [prefix]
        if not base.is_dir():
            return []
        keys = []
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                if TMP_MARKER in name:
                    continue
                keys.append(str(Path(dirpath, name).relative_to(self.root)))
        return sorted(keys)

    def delete_prefix(self, prefix: str) -> None:
        path = self._path(prefix)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            path.unlink(missing_ok=True)
        else:
            return
        if path.parent.exists():
            _fsync_dir(path.parent)

    def url_for(self, key: str) -> str:
        return f"{self.uri}/{key}" if key else self.uri
