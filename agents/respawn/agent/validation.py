"""Validates each committed checkpoint in a separate, low-priority process, kept warm.

The checkpoint library's validate entry point reloads the checkpoint into a
fresh model (the job's model and validation-batch factories, and its eval_fn)
on the training GPU when there is one, and prints its verdict as a JSON object
(`result`, `loss`, `reference_loss`, `message`) on the last line of its output.
It runs warm (`--serve`): started when the agent has the job, PyTorch and the
job's factory modules imported once, so a checkpoint's check starts the moment
it commits instead of after a fresh Python's imports (seconds on a small VM, every
checkpoint). A warm validator that dies mid-check is replaced by the one-shot
command for that checkpoint (and started again for the next, up to
MAX_WARM_STARTS); a check that gives no verdict within the timeout is killed and
reported as `error`: validation never holds the job up.

A validator that fails (no verdict, or `error`: the eval_fn raised, returned a
non-finite number) is reported as `error` with its cause, never as `invalid`. One
validation runs at a time, under `nice`, so it never competes with training for
the CPU; the result is reported as soon as it is known, so a bad checkpoint is
known before it is needed. When checkpoints commit faster than they validate, only
the newest waiting one is validated (it is the one a resume would use), and a
checkpoint that could not be read after a newer one committed is taken as rotated
away, not as invalid.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

from respawn import protocol
from respawn.agent.supervisor import die_with_parent

log = logging.getLogger(__name__)

# The check's arguments; `{uri}`, `{model_factory}`, `{batch_factory}`, `{eval_fn}` and
# `{tolerance}` are filled in per checkpoint.
ARGUMENTS = "{uri} --model-factory {model_factory} --batch-factory {batch_factory} --eval-fn={eval_fn} --tolerance {tolerance}"
ENTRY = f"{shlex.quote(sys.executable)} -m respawn.checkpoint.validate"
DEFAULT_COMMAND = f"{ENTRY} {ARGUMENTS}"  # one-shot: a fresh process per checkpoint
SERVE_COMMAND = f"{ENTRY} --serve"  # warm: ARGUMENTS sent per checkpoint, one line each
NICENESS = 19
MAX_MESSAGE_CHARS = 500  # what the control plane stores
DEFAULT_TIMEOUT_S = 900.0
MAX_WARM_STARTS = 3  # a validator that keeps dying is not started again: the one-shot command goes on


@dataclass
class _Check:
    report: protocol.CheckpointReport
    warm: bool
    started: float = field(default_factory=time.monotonic)
    proc: subprocess.Popen | None = None  # one-shot only
    output: "tempfile._TemporaryFileWrapper | None" = None


def parse_verdict(output: str, exit_code: int) -> tuple[protocol.ValidationReport | None, bool, str]:
    """The verdict on the last JSON line of the validator's output (None when there is
    none), whether it says the checkpoint could not be read, and the checkpoint's id
    it read (empty when it names none)."""
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
            ), doc.get("unreadable") is True, str(doc.get("checkpoint_id") or "")
    return None, False, ""


def _error(message: str) -> protocol.ValidationReport:
    return protocol.ValidationReport(result=protocol.ValidationResult.ERROR, message=message[:MAX_MESSAGE_CHARS])


class WarmProcess:
    """The `--serve` validator: requests on its stdin, answers read without blocking."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str | None):
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, start_new_session=True,
                                     preexec_fn=die_with_parent(os.getpid()))
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.started = time.monotonic()
        self.ready = False
        self._buffer = b""

    def send(self, arguments: list[str]) -> bool:
        try:
            self.proc.stdin.write((json.dumps(arguments) + "\n").encode())
            self.proc.stdin.flush()
            return True
        except OSError:  # it died: poll says so
            return False

    def answer(self) -> dict | None:
        """The next answer to a check, once one is complete (the ready line is noted)."""
        while True:
            try:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
            except BlockingIOError:
                chunk = None
            if chunk:
                self._buffer += chunk
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if doc.get("ready"):
                    self.ready = True
                    log.info("the validator is warm on %s, %.1fs after its start", doc.get("device"), time.monotonic() - self.started)
                elif "code" in doc:
                    return doc
            if not chunk:
                return None

    def dead(self) -> bool:
        return self.proc.poll() is not None

    def why(self) -> str:
        self.stderr.seek(0)
        return f"exit {self.proc.poll()}: {self.stderr.read().decode('utf-8', errors='replace')[-300:]}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.stderr):
            try:
                stream.close()
            except OSError:
                pass


class Validator:
    def __init__(self, *, command: str, spec: protocol.ValidationSpec, env: dict[str, str], cwd: str | None,
                 on_result: Callable[[str, protocol.ValidationReport], None], serve_command: str = "",
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        self.command = command
        self.serve_command = serve_command
        self.spec = spec
        self.env = env
        self.cwd = cwd
        self.on_result = on_result
        self.timeout_s = timeout_s
        self._waiting: protocol.CheckpointReport | None = None
        self._running: _Check | None = None
        self._newest_step = -1
        self._warm: WarmProcess | None = None
        self._warm_starts = 0
        self._start_warm()

    def _start_warm(self) -> None:
        if not self.serve_command or self._warm_starts >= MAX_WARM_STARTS:
            return
        self._warm_starts += 1
        modules = {spec.partition(":")[0] for spec in (self.spec.model_factory, self.spec.batch_factory, self.spec.eval_fn) if spec}
        argv = ["nice", "-n", str(NICENESS), *shlex.split(self.serve_command), *(f"--preload={m}" for m in sorted(modules))]
        try:
            self._warm = WarmProcess(argv, self.env, self.cwd)
        except OSError as exc:
            log.warning("could not start the warm validator %s (%s): each checkpoint gets a fresh one", argv, exc)

    def warm(self) -> bool:
        """Whether the warm validator has said it is ready (for a caller timing checks: call it
        before the first submit)."""
        if self._warm is not None and not self._warm.ready:
            self._warm.answer()
        return self._warm is not None and self._warm.ready

    def submit(self, report: protocol.CheckpointReport) -> None:
        self._waiting = report
        self._newest_step = max(self._newest_step, report.step)
        self.poll()

    def poll(self) -> None:
        """Collect a finished validation and start the next one. Called from the agent's loop."""
        running = self._running
        if running is None:
            self.warm()  # says so in the agent's log once it is
        elif time.monotonic() - running.started > self.timeout_s:
            self._running = None
            self._abandon(running)
            self._report(running.report, _error(f"the validator gave no verdict within {self.timeout_s:g}s "
                                                "(hung?): killed; the checkpoint is kept"))
        else:
            finished = self._finished(running)
            if finished is None:
                return
            self._running = None
            if finished == "fall back":
                self._start(running.report, warm=False)
                return
            self._conclude(running, *finished)
        if self._waiting is not None:
            report, self._waiting = self._waiting, None
            self._start(report, warm=True)

    def _finished(self, check: _Check) -> tuple[str, int] | str | None:
        """(output, exit code) of a finished check, "fall back" when the warm validator
        died in it, None while it runs."""
        if check.warm:
            doc = self._warm.answer()
            if doc is not None:
                return str(doc.get("output", "")), int(doc.get("code", 2))
            if not self._warm.dead():
                return None
            self._replace_warm(f"died validating step {check.report.step}")
            return "fall back"
        code = check.proc.poll()
        if code is None:
            return None
        check.output.seek(0)
        output = check.output.read().decode("utf-8", errors="replace")
        check.output.close()
        return output, code

    def _replace_warm(self, what: str) -> None:
        log.warning("the warm validator %s (%s); starting another", what, self._warm.why())
        self._warm.kill()
        self._warm = None
        self._start_warm()

    def _abandon(self, check: _Check) -> None:
        if check.warm:
            self._replace_warm(f"hung on step {check.report.step}")
        else:
            os.killpg(check.proc.pid, 9)
            check.proc.wait()
            check.output.close()

    def _report(self, report: protocol.CheckpointReport, verdict: protocol.ValidationReport, read_id: str = "") -> None:
        checkpoint_id = report.checkpoint_id or read_id
        if checkpoint_id:
            self.on_result(checkpoint_id, verdict)
        else:
            log.info("the verdict on %s (%s) names no checkpoint id to report it under", report.uri, verdict.result)

    def _conclude(self, running: _Check, output: str, code: int) -> None:
        verdict, unreadable, read_id = parse_verdict(output, code)
        if (verdict is None or unreadable) and running.report.step < self._newest_step:
            log.info("checkpoint at step %d could not be validated after a newer one committed (rotated away?): %s", running.report.step, output[-300:])
            return
        if verdict is None:
            verdict = _error(f"validator exited {code} without a verdict: {output[-400:]}")
        self._report(running.report, verdict, read_id)

    def _arguments(self, template: str, report: protocol.CheckpointReport) -> list[str]:
        values = {"uri": report.uri, "model_factory": self.spec.model_factory, "batch_factory": self.spec.batch_factory,
                  "eval_fn": self.spec.eval_fn, "tolerance": self.spec.tolerance}
        return [arg.format(**values) for arg in shlex.split(template)]

    def _start(self, report: protocol.CheckpointReport, *, warm: bool) -> None:
        if warm and self._warm is not None and self._warm.dead():
            self._replace_warm("died between checks")
        if warm and self._warm is not None and self._warm.send(self._arguments(ARGUMENTS, report)):
            self._running = _Check(report, warm=True)
            return
        argv = ["nice", "-n", str(NICENESS), *self._arguments(self.command, report)]
        output = tempfile.TemporaryFile()
        try:
            proc = subprocess.Popen(argv, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent(os.getpid()))
        except OSError as exc:
            output.close()
            self._report(report, _error(f"could not start the validator {argv}: {exc}"))
            return
        self._running = _Check(report, warm=False, proc=proc, output=output)

    def stop(self) -> None:
        """Abandon validation (the VM is going away): results would come too late."""
        self._waiting = None
        if self._running is not None and not self._running.warm:
            self._abandon(self._running)
        self._running = None
        if self._warm is not None:
            self._warm.kill()
            self._warm = None
