"""Validates each committed checkpoint in a separate, low-priority process.

The checkpoint library's validate entry point reloads the checkpoint into a
fresh model (the job's model and validation-batch factories) and prints its
verdict as a JSON object (`result`, `loss`, `reference_loss`, `message`) on
the last line of its output. One validation runs at a time, under `nice`, so
it never competes with training for the CPU; the result is reported as soon as
it is known, so a bad checkpoint is known before it is needed.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
import tempfile
from collections import deque
from dataclasses import dataclass
from typing import Callable

from agents import protocol
from agents.agent.supervisor import die_with_parent

log = logging.getLogger(__name__)

DEFAULT_COMMAND = f"{shlex.quote(sys.executable)} -m agents.checkpoint.validate {{uri}}"
NICENESS = 19
MAX_MESSAGE_CHARS = 500  # what the control plane stores


@dataclass
class _Running:
    checkpoint_id: str
    proc: subprocess.Popen
    output: "tempfile._TemporaryFileWrapper"


def parse_verdict(output: str, exit_code: int) -> protocol.ValidationReport:
    """The verdict on the last JSON line of the validator's output; a crash is `invalid`."""
    for line in reversed(output.strip().splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("result") in (protocol.ValidationResult.VALID, protocol.ValidationResult.INVALID):
            loss, ref = doc.get("loss"), doc.get("reference_loss")
            return protocol.ValidationReport(
                result=doc["result"],
                loss=float(loss) if isinstance(loss, (int, float)) else None,
                reference_loss=float(ref) if isinstance(ref, (int, float)) else None,
                message=str(doc.get("message", ""))[:MAX_MESSAGE_CHARS],
            )
    return protocol.ValidationReport(
        result=protocol.ValidationResult.INVALID,
        message=f"validator exited {exit_code} without a verdict: {output[-400:]}"[:MAX_MESSAGE_CHARS],
    )


class Validator:
    def __init__(self, *, command: str, env: dict[str, str], cwd: str | None, on_result: Callable[[str, protocol.ValidationReport], None]):
        self.command = command
        self.env = env
        self.cwd = cwd
        self.on_result = on_result
        self._queue: deque[protocol.CheckpointReport] = deque()
        self._running: _Running | None = None

    def submit(self, report: protocol.CheckpointReport) -> None:
        self._queue.append(report)
        self.poll()

    def poll(self) -> None:
        """Collect a finished validation and start the next one. Called from the agent's loop."""
        if self._running is not None:
            code = self._running.proc.poll()
            if code is None:
                return
            self._running.output.seek(0)
            output = self._running.output.read().decode("utf-8", errors="replace")
            self._running.output.close()
            checkpoint_id, self._running = self._running.checkpoint_id, None
            self.on_result(checkpoint_id, parse_verdict(output, code))
        if self._queue:
            self._start(self._queue.popleft())

    def _start(self, report: protocol.CheckpointReport) -> None:
        argv = ["nice", "-n", str(NICENESS), *shlex.split(self.command.format(uri=report.uri))]
        output = tempfile.TemporaryFile()
        try:
            proc = subprocess.Popen(argv, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent(os.getpid()))
        except OSError as exc:
            output.close()
            self.on_result(report.checkpoint_id, protocol.ValidationReport(result=protocol.ValidationResult.INVALID, message=f"could not start the validator {argv}: {exc}"[:MAX_MESSAGE_CHARS]))
            return
        self._running = _Running(report.checkpoint_id, proc, output)

    def busy(self) -> bool:
        return self._running is not None or bool(self._queue)

    def stop(self) -> None:
        """Abandon validation (the VM is going away): results would come too late."""
        self._queue.clear()
        if self._running is not None:
            self._running.proc.kill()
            self._running.proc.wait()
            self._running.output.close()
            self._running = None
