"""The agent's side of the agent <-> trainer channel (agents/respawn/protocol.py, end).

The trainer replaces the status file atomically and appends one JSON line per
committed checkpoint; the agent writes the control and notice files. Anything
unreadable the trainer writes is logged with its raw text and skipped: a
trainer's bug must not stop the agent.
"""

from __future__ import annotations

import json
import logging
import math
import os
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from respawn import protocol

log = logging.getLogger(__name__)

STATUS_NAME = "status.json"
CHECKPOINTS_NAME = "checkpoints.jsonl"
VALIDATIONS_NAME = "validations.jsonl"
CONTROL_NAME = "control.json"
NOTICE_NAME = "notice.json"
METRICS_NAME = "metrics.jsonl"
SIGNAL_TARGETS_NAME = "signal-targets"  # a directory: one file per training process (agents/respawn/checkpoint/signals.py)
CHECKPOINT_EVENTS = uuid.UUID("6f1d0b6e-5a55-4c1e-9a43-0c5e3c1f2b7d")  # namespace of checkpoint reports' event_ids


@dataclass(frozen=True)
class ChannelPaths:
    status: str
    checkpoints: str
    validations: str
    control: str
    notice: str
    metrics: str
    signal_targets: str

    @classmethod
    def in_dir(cls, directory: str) -> "ChannelPaths":
        os.makedirs(directory, mode=0o700, exist_ok=True)
        d = Path(directory)
        return cls(str(d / STATUS_NAME), str(d / CHECKPOINTS_NAME), str(d / VALIDATIONS_NAME), str(d / CONTROL_NAME),
                   str(d / NOTICE_NAME), str(d / METRICS_NAME), str(d / SIGNAL_TARGETS_NAME))

    def env(self) -> dict[str, str]:
        return {
            protocol.ENV_STATUS_FILE: self.status,
            protocol.ENV_CHECKPOINTS_FILE: self.checkpoints,
            protocol.ENV_VALIDATIONS_FILE: self.validations,
            protocol.ENV_CONTROL_FILE: self.control,
            protocol.ENV_NOTICE_FILE: self.notice,
            protocol.ENV_METRICS_FILE: self.metrics,
            protocol.ENV_SIGNAL_TARGETS_DIR: self.signal_targets,
        }


def write_json_atomic(path: str, body: dict[str, Any]) -> None:
    """Replace `path` so a reader sees the old or the new content. No fsync: these
    files matter only while both processes live, and an fsync can stall for
    seconds while a checkpoint is being written to the same disk."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(body, f)
    os.replace(tmp, path)


def finite_or_none(value: Any) -> float | None:
    """A JSON-safe number: NaN and infinities (which `json` happily reads) become None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class StatusReader:
    """The trainer's latest status, re-read only when the file changed."""

    def __init__(self, path: str):
        self.path = path
        self._mtime: int | None = None
        self.latest: dict[str, Any] = {}
        self.start_step = 0
        """Where the run stands until its trainer reports a step: the step it resumes from.
        Reporting 0 there would tell the control plane the run went back to the start."""

    def restart(self, start_step: int) -> None:
        """A new trainer starts at `start_step`: nothing the stopped one said is its."""
        if os.path.exists(self.path):
            os.remove(self.path)
        self.latest, self._mtime, self.start_step = {}, None, start_step

    def read(self) -> dict[str, Any]:
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except FileNotFoundError:
            return self.latest
        if mtime == self._mtime:
            return self.latest
        self._mtime = mtime
        try:
            with open(self.path) as f:
                raw = f.read()
            doc = json.loads(raw)
            if not isinstance(doc, dict):
                raise ValueError(f"expected a JSON object, got {type(doc).__name__}")
        except FileNotFoundError:
            return self.latest
        except (OSError, ValueError) as exc:
            log.warning("trainer status file %s unreadable (%s): %r", self.path, exc, locals().get("raw", "")[:500])
            return self.latest
        self.latest = doc
        return doc

    def heartbeat(self, last_checkpoint: protocol.CheckpointReport | None = None) -> protocol.Heartbeat:
        """The status as a heartbeat; checkpoint stats the status lacks come from the last commit."""
        s = self.read()
        beat = protocol.Heartbeat(
            step=self.start_step if int_or_none(s.get("step")) is None else s["step"],
            loss=finite_or_none(s.get("loss")),
            samples_per_s=finite_or_none(s.get("samples_per_s")),
            last_checkpoint_step=int_or_none(s.get("last_checkpoint_step")),
            checkpoint_save_s=finite_or_none(s.get("checkpoint_save_s")),
            checkpoint_stall_s=finite_or_none(s.get("checkpoint_stall_s")),
            memory_resume_step=int_or_none(s.get("memory_resume_step")),
        )
        if last_checkpoint is not None:
            if beat.last_checkpoint_step is None:
                beat.last_checkpoint_step = last_checkpoint.step
            if beat.checkpoint_save_s is None:
                beat.checkpoint_save_s = last_checkpoint.save_s
            if beat.checkpoint_stall_s is None:
                beat.checkpoint_stall_s = last_checkpoint.stall_s
        return beat


REQUIRED_CHECKPOINT_FIELDS = {"checkpoint_id": str, "step": int, "uri": str, "bytes": int, "manifest_digest": str}


def parse_checkpoint_line(line: str) -> protocol.CheckpointReport:
    """One line of the checkpoints JSONL as a report; ValueError naming what is wrong."""
    doc = json.loads(line)
    if not isinstance(doc, dict):
        raise ValueError(f"expected a JSON object, got {type(doc).__name__}")
    for name, kind in REQUIRED_CHECKPOINT_FIELDS.items():
        if not isinstance(doc.get(name), kind) or isinstance(doc.get(name), bool):
            raise ValueError(f"field {name!r} must be a {kind.__name__}, got {doc.get(name)!r}")
    if doc.get("kind", protocol.CheckpointKind.PERIODIC) not in protocol.CheckpointKind.ALL:
        raise ValueError(f"kind {doc.get('kind')!r} is not one of {', '.join(protocol.CheckpointKind.ALL)}")
    for name in ("save_s", "stall_s", "reference_loss", "persist_s"):
        if name in doc:
            doc[name] = finite_or_none(doc[name])
    doc.pop("notice_window_s", None)  # the agent's to say
    tiers = doc.get("tiers", [protocol.CheckpointTier.STORAGE])
    if not isinstance(tiers, list) or protocol.CheckpointTier.STORAGE not in tiers \
            or not set(tiers) <= set(protocol.CheckpointTier.ALL):
        # The checkpoint committed (it is in storage): a garbled record of where else it is
        # held must not lose its report; it claims storage alone.
        log.warning("checkpoint %s: tiers %r is not a list of %s naming storage: reported as in storage only",
                    doc["checkpoint_id"], tiers, ", ".join(protocol.CheckpointTier.ALL))
        doc["tiers"] = [protocol.CheckpointTier.STORAGE]
    for name in ("event_id", "sent_at"):  # a trainer may give its own
        if not isinstance(doc.get(name), str) or not doc.get(name):
            doc.pop(name, None)
    # Otherwise the event_id follows from the checkpoint: an agent restarted on this
    # file reports its lines again, and the control plane applies each once.
    doc.setdefault("event_id", str(uuid.uuid5(CHECKPOINT_EVENTS, doc["checkpoint_id"])))
    return protocol.from_dict(protocol.CheckpointReport, doc)


MAX_VALIDATION_MESSAGE_CHARS = 500  # what the control plane stores


def parse_validation_line(line: str) -> tuple[str, protocol.ValidationReport]:
    """One line of the validations JSONL: the checkpoint's id and the trainer's verdict on it."""
    doc = json.loads(line)
    if not isinstance(doc, dict) or not isinstance(doc.get("checkpoint_id"), str):
        raise ValueError("expected a JSON object with a checkpoint_id")
    if doc.get("result") not in (protocol.ValidationResult.VALID, protocol.ValidationResult.INVALID):
        raise ValueError(f"result {doc.get('result')!r} is neither valid nor invalid")
    report = protocol.ValidationReport(
        result=doc["result"], loss=finite_or_none(doc.get("loss")), reference_loss=finite_or_none(doc.get("reference_loss")),
        message=str(doc.get("message") or "")[:MAX_VALIDATION_MESSAGE_CHARS])
    return doc["checkpoint_id"], report


class JsonlTail:
    """New complete lines of a JSONL file the trainer appends to, parsed by `parse`, since the last call."""

    def __init__(self, path: str, parse):
        self.path = path
        self.parse = parse
        self._offset = 0

    def new_reports(self) -> list:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self._offset += end
        reports = []
        for raw in data[:end].splitlines():
            if not raw.strip():
                continue
            try:
                reports.append(self.parse(raw.decode("utf-8", errors="replace")))
            except (ValueError, TypeError) as exc:
                log.warning("skipping an unreadable line of %s (%s): %r", self.path, exc, raw[:500])
        return reports


class CheckpointsTail(JsonlTail):
    """The checkpoints JSONL: one CheckpointReport per commit."""

    def __init__(self, path: str):
        super().__init__(path, parse_checkpoint_line)


class ValidationsTail(JsonlTail):
    """The validations JSONL: (checkpoint_id, ValidationReport) per verdict the trainer reached."""

    def __init__(self, path: str):
        super().__init__(path, parse_validation_line)


def parse_metric_line(line: str) -> protocol.StepMetric:
    """One line of the metrics JSONL; ValueError naming what is wrong. A figure that is
    not a finite number (a diverged loss) is shipped as none."""
    doc = json.loads(line)
    if not isinstance(doc, dict) or int_or_none(doc.get("step")) is None or doc["step"] < 0:
        raise ValueError("expected a JSON object with a step, a whole number from 0")
    at = finite_or_none(doc.get("time"))
    if at is None:
        raise ValueError(f"time {doc.get('time')!r} is not a number of seconds")
    return protocol.StepMetric(step=doc["step"], time=datetime.fromtimestamp(at, timezone.utc).isoformat(),
                               loss=finite_or_none(doc.get("loss")), samples_per_s=finite_or_none(doc.get("samples_per_s")))


class MetricsTail(JsonlTail):
    """The metrics JSONL: every step the trainer reported, read once per heartbeat
    into at most one batch. A trainer reporting more steps than a batch holds in one
    heartbeat interval is thinned evenly (its newest step always kept), so what
    the agent sends stays bounded however fast the steps go."""

    def __init__(self, path: str):
        super().__init__(path, parse_metric_line)

    def batch(self) -> protocol.MetricsBatch | None:
        points = self.new_reports()
        if not points:
            return None
        most = protocol.MAX_METRIC_POINTS_PER_BATCH
        if len(points) > most:
            stride = -(-len(points) // most)  # ceiling: at most `most` points, the last one kept
            points = points[::-1][::stride][::-1]
        return protocol.MetricsBatch(points=points)


MAX_READ_BYTES = 4 << 20  # per call, so a trainer printing gigabytes cannot balloon the agent


class LogTail:
    """Trainer output lines, in bounded batches with their line offsets."""

    def __init__(self, path: str, *, byte_offset: int = 0, line_offset: int = 0):
        """`byte_offset`/`line_offset`: where shipping stopped (`position()`) when
        an agent restarted on the same log."""
        self.path = path
        self._byte_offset = byte_offset
        self.line_offset = line_offset  # index of the next line to ship

    def position(self) -> dict[str, int]:
        return {"byte_offset": self._byte_offset, "line_offset": self.line_offset}

    def batches(self, *, final: bool = False) -> list[protocol.LogBatch]:
        """Lines completed since the last call (at most MAX_READ_BYTES of them; the
        rest comes next time), and with `final` also an unterminated last line."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._byte_offset)
                data = f.read(MAX_READ_BYTES)
                more = bool(f.read(1))
        except FileNotFoundError:
            return []
        end = len(data) if final and not more else data.rfind(b"\n") + 1
        if end == 0 and len(data) == MAX_READ_BYTES:
            end = len(data)  # one enormous line: ship it cut rather than stall behind it
        self._byte_offset += end
        lines = [
            line.decode("utf-8", errors="replace")[: protocol.MAX_LOG_LINE_CHARS]
            for line in data[:end].splitlines()
        ]
        out = []
        for start in range(0, len(lines), protocol.MAX_LOG_LINES_PER_BATCH):
            chunk = lines[start : start + protocol.MAX_LOG_LINES_PER_BATCH]
            out.append(protocol.LogBatch(offset=self.line_offset, lines=chunk))
            self.line_offset += len(chunk)
        return out


def output_tail(path: str, max_chars: int = protocol.MAX_OUTPUT_TAIL_CHARS) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_chars * 2))
            return f.read().decode("utf-8", errors="replace")[-max_chars:]
    except FileNotFoundError:
        return ""


def last_exception_line(tail: str) -> str:
    """The final line of the last Python traceback in `tail`, e.g. "ValueError: bad shape"."""
    lines = tail.splitlines()
    start = max((i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")), default=None)
    if start is None:
        return ""
    for line in lines[start + 1 :]:
        if line and not line[0].isspace():
            return line.strip()[: protocol.MAX_LOG_LINE_CHARS]
    return ""
