"""The trainer's side of the agent <-> trainer channel (agents/respawn/protocol.py, end).

Every piece is optional: without the environment variables the library runs
standalone. Files the agent writes (control, notice) are read cheaply: one stat
per step (microseconds), a read only when the file was replaced. Files the
trainer writes are replaced atomically (status) or appended one whole JSON line
at a time (checkpoints, validations).
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from pathlib import Path

from respawn import protocol


def write_json_atomic(path: str | Path, body: dict) -> None:
    """Replace `path` with `body` so a reader sees the old or the new content, never a mix."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body))
    os.replace(tmp, path)


class ControlFile:
    """Polls the agent's control file for a new checkpoint interval."""

    def __init__(self, path: str | None):
        self.path = Path(path) if path else None
        self._seen: tuple | None = None

    def new_interval(self) -> float | None:
        """A changed `checkpoint_interval_s`, or None when there is nothing new."""
        if self.path is None:
            return None
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        # An atomic replace changes the inode even within one mtime tick.
        seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        if seen == self._seen:
            return None
        self._seen = seen
        try:
            value = json.loads(self.path.read_text()).get("checkpoint_interval_s")
        except (OSError, ValueError):
            return None  # a half-visible write cannot happen (atomic replace), a bad one is ignored
        return float(value) if value else None


def notice_deadline(path: str | None) -> float | None:
    """The notice deadline the agent wrote, as seconds from now (None if unknown)."""
    if not path or not os.path.exists(path):
        return None
    try:
        deadline = json.loads(Path(path).read_text()).get("deadline")
        if not deadline:
            return None
        return datetime.fromisoformat(deadline).timestamp() - time.time()
    except (OSError, ValueError, AttributeError):
        return None


def notice_handover(path: str | None) -> tuple[tuple[str, int], str, int] | None:
    """The store the notice save is handed over to, as the agent wrote it in the notice
    file (`handover`: a spare booted during the notice, docs/memory-tier.md): its address,
    its token and the node the noticed VM's ranks are there; None when there is none or it
    is unreadable (the save goes to storage alone)."""
    if not path or not os.path.exists(path):
        return None
    try:
        given = json.loads(Path(path).read_text()).get("handover")
        host, _, port = given["address"].rpartition(":")
        token, node = given["token"], given["node"]
        if not host or not port.isdigit() or not isinstance(token, str) or not token or type(node) is not int:
            return None
        return (host, int(port)), token, node
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return None


def append_checkpoint_report(path: str | None, report: protocol.CheckpointReport) -> None:
    _append_line(path, protocol.to_dict(report))


def append_validation_report(path: str | None, checkpoint_id: str, report: protocol.ValidationReport) -> None:
    _append_line(path, {"checkpoint_id": checkpoint_id, **protocol.to_dict(report)})


def _append_line(path: str | None, body: dict) -> None:
    if not path:
        return
    line = (json.dumps(body) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one write with O_APPEND: the agent never sees half a line interleaved
        os.fsync(fd)
    finally:
        os.close(fd)
