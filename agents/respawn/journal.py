"""The agent's offline journal: every report is appended here (fsync'd) before it
is sent, and sent in order until the control plane has taken it.

File format, one record per line: `<crc32 of the JSON, 8 hex digits> <JSON>\\n`.
A crash can leave the last line torn (no newline, or a checksum that does not
match): it is ignored, and cut off on open so later records stay readable.
A separate cursor file holds the byte offset up to which records were delivered;
it is replaced atomically after each delivery, so a record is resent at most
once after a crash, and the server's `event_id` deduplication makes that harmless.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

JOURNAL_NAME = "journal.log"
CURSOR_NAME = "journal.cursor"
# Once everything is delivered and the file is this big, start it afresh.
COMPACT_AT_BYTES = 4 << 20


@dataclass(frozen=True)
class Entry:
    path: str  # the protocol path under API_PREFIX, e.g. "heartbeat"
    body: dict[str, Any]
    end: int  # byte offset just past this record


def _encode(record: dict[str, Any]) -> bytes:
    payload = json.dumps(record, separators=(",", ":"), sort_keys=True).encode()
    return b"%08x %s\n" % (zlib.crc32(payload), payload)


def _decode(line: bytes) -> dict[str, Any] | None:
    if not line.endswith(b"\n") or len(line) < 10 or line[8:9] != b" ":
        return None
    payload = line[9:-1]
    try:
        if int(line[:8], 16) != zlib.crc32(payload):
            return None
        record = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("path"), str) or not isinstance(record.get("body"), dict):
        return None
    return record


def fsync_dir(path: str) -> None:
    """Make a rename or a new file in `path` durable (respawn.agent.session uses it too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Journal:
    """Append-only, fsync'd queue of reports. Thread-safe."""

    def __init__(self, directory: str):
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self.directory = directory
        self._path = os.path.join(directory, JOURNAL_NAME)
        self._cursor_path = os.path.join(directory, CURSOR_NAME)
        self._cond = threading.Condition()
        self._pending: deque[Entry] = deque()
        self._delivered = self._read_cursor()
        self._size = self._load()
        self._file = open(self._path, "ab", buffering=0)

    def _read_cursor(self) -> int:
        try:
            with open(self._cursor_path) as f:
                return int(f.read().strip() or 0)
        except FileNotFoundError:
            return 0
        except ValueError:
            log.warning("journal cursor %s unreadable; resending every record (the server drops duplicates)", self._cursor_path)
            return 0

    def _load(self) -> int:
        """Read the complete records after the cursor; cut off a torn tail."""
        good_end = 0
        try:
            with open(self._path, "rb") as f:
                for line in f:
                    record = _decode(line)
                    if record is None:
                        log.warning("journal %s: dropping a torn record at byte %d: %r", self._path, good_end, line[:200])
                        break
                    good_end += len(line)
                    if good_end > self._delivered:
                        self._pending.append(Entry(record["path"], record["body"], good_end))
        except FileNotFoundError:
            return 0
        if os.path.getsize(self._path) != good_end:
            with open(self._path, "r+b") as f:
                f.truncate(good_end)
                os.fsync(f.fileno())
        if self._delivered > good_end:
            self._delivered = 0
        return good_end

    def append(self, path: str, body: dict[str, Any]) -> None:
        data = _encode({"path": path, "body": body})
        with self._cond:
            self._file.write(data)
            os.fsync(self._file.fileno())
            self._size += len(data)
            self._pending.append(Entry(path, body, self._size))
            self._cond.notify_all()

    def next(self, timeout: float | None = None) -> Entry | None:
        """The oldest undelivered record, waiting up to `timeout` for one."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending, timeout)
            return self._pending[0] if self._pending else None

    def delivered(self, entry: Entry) -> None:
        """`entry` (the head) reached the control plane or was refused for good."""
        with self._cond:
            if not self._pending or self._pending[0] is not entry:
                raise RuntimeError("journal: only the oldest pending record can be marked delivered")
            self._pending.popleft()
            self._delivered = entry.end
            self._write_cursor(entry.end)
            if not self._pending and self._size >= COMPACT_AT_BYTES:
                self._compact()
            self._cond.notify_all()

    def pending_count(self) -> int:
        with self._cond:
            return len(self._pending)

    def wait_empty(self, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending, timeout)

    def _write_cursor(self, offset: int) -> None:
        tmp = self._cursor_path + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(offset))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._cursor_path)
        fsync_dir(self.directory)

    def _compact(self) -> None:
        # Cursor first: a crash in between resends delivered records (deduplicated
        # by event_id) rather than skipping new ones.
        self._write_cursor(0)
        self._file.truncate(0)
        os.fsync(self._file.fileno())
        self._size = self._delivered = 0

    def close(self) -> None:
        self._file.close()
