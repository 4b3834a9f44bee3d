"""Validates each committed checkpoint in a separate, low-priority process.

The checkpoint library's validate entry point reloads the checkpoint into a
fresh model (the job's model and validation-batch factories, and its eval_fn)
on the training GPU when there is one, and prints its verdict as a JSON object
(`result`, `loss`, `reference_loss`, `message`) on the last line of its output.
A validator that fails (no verdict, or `error`: the eval_fn raised, returned a
non-finite number) is reported as `error` with its cause, never as `invalid`. One validation runs at a time, under `nice`, so
it never competes with training for the CPU; the result is reported as soon as
it is known, so a bad checkpoint is known before it is needed. When checkpoints
commit faster than they validate, only the newest waiting one is validated
(it is the one a resume would use), and a checkpoint that could not be read
after a newer one committed is taken as rotated away, not as invalid.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable

from respawn import protocol
from respawn.agent.supervisor import die_with_parent

log = logging.getLogger(__name__)

# `{uri}`, `{model_factory}`, `{batch_factory}`, `{eval_fn}` and `{tolerance}` are filled in per checkpoint.
DEFAULT_COMMAND = (f"{shlex.quote(sys.executable)} -m respawn.checkpoint.validate {{uri}} --model-factory {{model_factory}} "
                   "--batch-factory {batch_factory} --eval-fn={eval_fn} --tolerance {tolerance}")
NICENESS = 19
MAX_MESSAGE_CHARS = 500  # what the control plane stores


@dataclass
class _Running:
    checkpoint_id: str
    step: int
    proc: subprocess.Popen
    output: "tempfile._TemporaryFileWrapper"


def parse_verdict(output: str, exit_code: int) -> tuple[protocol.ValidationReport | None, bool]:
    """The verdict on the last JSON line of the validator's output (None when there is
    none), and whether it says the checkpoint could not be read."""
    for line in reversed(output.strip().splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("result") in protocol.ValidationResult.FROM_AGENT:
            loss, ref = doc.get("loss"), doc.get("reference_loss")
            return protocol.ValidationReport(
                result=doc["result"],
                loss=float(loss) if isinstance(loss, (int, float)) else None,
                reference_loss=float(ref) if isinstance(ref, (int, float)) else None,
                message=str(doc.get("message", ""))[:MAX_MESSAGE_CHARS],
            ), doc.get("unreadable") is True
    return None, False


class Validator:
    def __init__(self, *, command: str, spec: protocol.ValidationSpec, env: dict[str, str], cwd: str | None, on_result: Callable[[str, protocol.ValidationReport], None]):
        self.command = command
        self.spec = spec
        self.env = env
        self.cwd = cwd
        self.on_result = on_result
        self._waiting: protocol.CheckpointReport | None = None
        self._running: _Running | None = None
        self._newest_step = -1

    def submit(self, report: protocol.CheckpointReport) -> None:
        self._waiting = report
        self._newest_step = max(self._newest_step, report.step)
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
            running, self._running = self._running, None
            self._conclude(running, *parse_verdict(output, code), output, code)
        if self._waiting is not None:
            report, self._waiting = self._waiting, None
            self._start(report)

    def _conclude(self, running: "_Running", verdict: protocol.ValidationReport | None, unreadable: bool, output: str, code: int) -> None:
        if (verdict is None or unreadable) and running.step < self._newest_step:
            log.info("checkpoint at step %d could not be validated after a newer one committed (rotated away?): %s", running.step, output[-300:])
            return
        if verdict is None:
            verdict = protocol.ValidationReport(result=protocol.ValidationResult.ERROR, message=f"validator exited {code} without a verdict: {output[-400:]}"[:MAX_MESSAGE_CHARS])
        self.on_result(running.checkpoint_id, verdict)

    def _start(self, report: protocol.CheckpointReport) -> None:
        values = {"uri": report.uri, "model_factory": self.spec.model_factory, "batch_factory": self.spec.batch_factory,
                  "eval_fn": self.spec.eval_fn, "tolerance": self.spec.tolerance}
        argv = ["nice", "-n", str(NICENESS), *(arg.format(**values) for arg in shlex.split(self.command))]
        output = tempfile.TemporaryFile()
        try:
            proc = subprocess.Popen(argv, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent(os.getpid()))
        except OSError as exc:
            output.close()
            self.on_result(report.checkpoint_id, protocol.ValidationReport(result=protocol.ValidationResult.ERROR, message=f"could not start the validator {argv}: {exc}"[:MAX_MESSAGE_CHARS]))
            return
        self._running = _Running(report.checkpoint_id, report.step, proc, output)

    def stop(self) -> None:
        """Abandon validation (the VM is going away): results would come too late."""
        self._waiting = None
        if self._running is not None:
            self._running.proc.kill()
            self._running.proc.wait()
            self._running.output.close()
            self._running = None
