"""Helpers a training script uses to talk to the agent (agents/respawn/protocol.py, end).

`report(step, loss, samples_per_s)` replaces RESPAWN_STATUS_FILE atomically, at
most once per `min_interval_s` (the last call of a burst is not lost: the next
call after the interval writes the newest values), and appends every step's loss
and speed to RESPAWN_METRICS_FILE, which the agent ships for the loss curve.
Without the variables it does nothing, so scripts run unchanged outside Respawn.
"""

from __future__ import annotations

import json
import os
import time

from respawn import protocol
from respawn.checkpoint.channel import write_json_atomic

DEFAULT_MIN_INTERVAL_S = 1.0


class StatusReporter:
    def __init__(self, path: str | None = None, min_interval_s: float = DEFAULT_MIN_INTERVAL_S,
                 metrics_path: str | None = None):
        self.path = path if path is not None else os.environ.get(protocol.ENV_STATUS_FILE) or None
        self.metrics_path = metrics_path if metrics_path is not None else os.environ.get(protocol.ENV_METRICS_FILE) or None
        self.min_interval_s = min_interval_s
        self._last_write = float("-inf")
        self._metrics = None  # the metrics file, opened on the first step with a figure
        self.lasting: dict = {}
        """Fields every status written from now on carries: what the agent must not miss
        between two of its reads (the memory tier's resume step)."""

    def report(self, step: int, loss: float | None = None, samples_per_s: float | None = None, *, force: bool = False, **extra) -> bool:
        """Append the step's figures to the metrics file; write the status if the
        interval has passed (or `force`): True when written."""
        if loss is not None or samples_per_s is not None:
            self._append_metric(step, loss, samples_per_s)
        if self.path is None:
            return False
        now = time.monotonic()
        if not force and now - self._last_write < self.min_interval_s:
            return False
        self._last_write = now
        body = {"step": step, "loss": loss, "samples_per_s": samples_per_s, "time": time.time()} | self.lasting | extra
        write_json_atomic(self.path, body)
        return True

    def _append_metric(self, step: int, loss: float | None, samples_per_s: float | None) -> None:
        """One line per call, written through at once (no fsync: the agent reads it while
        both live, and drops what is not a finite number)."""
        if self.metrics_path is None:
            return
        if self._metrics is None:
            self._metrics = open(self.metrics_path, "a", buffering=1, encoding="utf-8")
        loss, samples_per_s = (None if v is None else float(v) for v in (loss, samples_per_s))
        self._metrics.write(json.dumps({"step": step, "loss": loss, "samples_per_s": samples_per_s,
                                        "time": time.time()}) + "\n")


_default: StatusReporter | None = None


def _reporter() -> StatusReporter:
    global _default
    if _default is None:
        _default = StatusReporter()
    return _default


def resumed_from_memory(step: int) -> None:
    """Tell the agent, in this status and every later one, that the run resumed at `step`
    from the memory tier: the control plane named an older checkpoint, and counts the
    work kept to the step the gang really went on from."""
    reporter = _reporter()
    reporter.lasting["memory_resume_step"] = step
    reporter.report(step, force=True)


def report(step: int, loss: float | None = None, samples_per_s: float | None = None, *, force: bool = False,
           **extra) -> bool:
    """Module-level convenience around one StatusReporter built from the environment."""
    return _reporter().report(step, loss, samples_per_s, force=force, **extra)
