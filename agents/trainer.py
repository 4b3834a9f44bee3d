"""Helpers a training script uses to talk to the agent (agents/protocol.py, end).

`report(step, loss, samples_per_s)` replaces RESPAWN_STATUS_FILE atomically, at
most once per `min_interval_s` (the last call of a burst is not lost: the next
call after the interval writes the newest values). Without the variable it does
nothing, so scripts run unchanged outside Respawn.
"""

from __future__ import annotations

import os
import time

from agents import protocol
from agents.checkpoint.channel import write_json_atomic

DEFAULT_MIN_INTERVAL_S = 1.0


class StatusReporter:
    def __init__(self, path: str | None = None, min_interval_s: float = DEFAULT_MIN_INTERVAL_S):
        self.path = path if path is not None else os.environ.get(protocol.ENV_STATUS_FILE) or None
        self.min_interval_s = min_interval_s
        self._last_write = float("-inf")

    def report(self, step: int, loss: float | None = None, samples_per_s: float | None = None, *, force: bool = False, **extra) -> bool:
        """Write the status if the interval has passed (or `force`); True when written."""
        if self.path is None:
            return False
        now = time.monotonic()
        if not force and now - self._last_write < self.min_interval_s:
            return False
        self._last_write = now
        body = {"step": step, "loss": loss, "samples_per_s": samples_per_s, "time": time.time()} | extra
        write_json_atomic(self.path, body)
        return True


_default: StatusReporter | None = None


def report(step: int, loss: float | None = None, samples_per_s: float | None = None, *, force: bool = False,
           **extra) -> bool:
    """Module-level convenience around one StatusReporter built from the environment."""
    global _default
    if _default is None:
        _default = StatusReporter()
    return _default.report(step, loss, samples_per_s, force=force, **extra)
