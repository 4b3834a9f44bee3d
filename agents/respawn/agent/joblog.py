"""The agent's own lines in the job's output, shipped with the trainer's and marked as
the agent's (protocol.AGENT_LINE_PREFIX): what it did and why (`say`), and what it
logs (registering, the trainer started, the validator warm, a control plane out of
reach, warnings), so a job whose trainer prints nothing yet is not silent. A message
the agent repeats (a retry at every poll of an unreachable metadata service) is shipped
once per REPEAT_QUIET_S, not every time: the output is the user's to read."""

from __future__ import annotations

import logging
import time
from datetime import datetime

from respawn import protocol

SAID = "said"  # a record's attribute: `say` wrote it already
REPEAT_QUIET_S = 300.0


def line(message: str) -> str:
    return f"{protocol.AGENT_LINE_PREFIX} {datetime.now().astimezone().isoformat(timespec='seconds')} {message}\n"


class JobLog(logging.Handler):
    """Appends the records of the `respawn` loggers (INFO and up) to the job's output file,
    which the trainer's output goes to too (both append: lines do not overwrite)."""

    def __init__(self, path: str):
        super().__init__(logging.INFO)
        self.path = path
        self.logger = logging.getLogger("respawn")
        self._shipped: dict[tuple[str, str], float] = {}  # (logger, message template) -> when last shipped

    def __enter__(self) -> "JobLog":
        self.logger.addHandler(self)
        if self.logger.getEffectiveLevel() > logging.INFO:
            self.logger.setLevel(logging.INFO)  # the lines are the user's, whatever the agent's own log level
        return self

    def __exit__(self, *exc) -> None:
        self.logger.removeHandler(self)

    def say(self, logger: logging.Logger, message: str) -> None:
        """`message` in the job's output now, and in the agent's log."""
        self._write(message)
        logger.info("%s", message, extra={SAID: True})

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, SAID, False):
            return
        key, now = (record.name, str(record.msg)), time.monotonic()
        if now - self._shipped.get(key, -REPEAT_QUIET_S) < REPEAT_QUIET_S:
            return
        self._shipped[key] = now
        try:
            message = record.getMessage()
            self._write(message if record.levelno < logging.WARNING else f"{record.levelname.lower()}: {message}")
        except Exception:  # noqa: BLE001 (logging's contract: a handler never raises)
            self.handleError(record)

    def _write(self, message: str) -> None:
        with open(self.path, "a") as f:
            f.write(line(message))
