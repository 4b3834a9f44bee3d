"""`respawn-agent preflight -- <training command>`: prove a script is spot-safe
before paying for spot VMs.

Four local runs of the command, each with the agent <-> trainer channel of
agents/respawn/protocol.py, as the agent would start it on a VM:

    reference   from scratch to the end, uninterrupted
    notice      from scratch; after two checkpoints: notice file + SIGTERM; it must
                commit a checkpoint and exit within the notice budget
    resume      from the notice checkpoint; SIGKILL while it writes a checkpoint (its
                directory there, its manifest not yet), else after one more commit
    finish      from the newest checkpoint the SIGKILL left, to the end

It passes when every resumed run continued after the step it resumed from, and
every step seen in both the reference and the interrupted runs has the same
loss (within a relative tolerance): the training loss from the metrics and status
files (every step the script reports through respawn.trainer.report), and
the reference (validation) loss of checkpoints where the script records one.
The restart logic works, not just exists. The notice goes where the agent sends it
(agents/respawn/agent/supervisor.py: the training processes the library registered, never the
process group, so DataLoader workers keep feeding the save).

Any kind of script: a PyTorch loop with Checkpointer, or one of the framework
integrations (agents/respawn/integrations: hf, lightning, accelerate, jax). The kind is read
from what each run's newest checkpoint says wrote it (state.json's `framework`, DESIGN
§11), and every run must agree; `--framework` names the kind expected, so a script
that saves through the wrong path (e.g. Trainer's own checkpoints beside ours) fails,
at the reference run's first checkpoint that says so.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from respawn import protocol
from respawn.agent.channel import (ChannelPaths, CheckpointsTail, MetricsTail, StatusReader, finite_or_none, int_or_none, output_tail,
                                  write_json_atomic)
from respawn.agent.supervisor import TrainerProcess

POLL_S = 0.005
SAVES_TO_CATCH = 3  # saves the crash trial waits through for one to kill in the middle of
FRAMEWORKS = ("torch", "hf", "lightning", "accelerate", "jax")
OWN_FORMAT = "the script's own format"


class PreflightFailure(Exception):
    """The script is not spot-safe; the message says what went wrong and what to check."""


@dataclass(kw_only=True)
class PreflightConfig:
    command: list[str]
    steps: int = 300
    """Total steps of each run (RESPAWN_TOTAL_STEPS)."""
    checkpoint_interval_s: float = 1.0
    """RESPAWN_CHECKPOINT_INTERVAL_S for every run: a few intervals fit in one run."""
    notice_budget_s: float = 25.0
    run_timeout_s: float = 300.0
    tolerance: float = 1e-6
    """Relative difference allowed between the losses of the same step."""
    work_dir: str = ""
    framework: str = "auto"
    """The kind of script (one of FRAMEWORKS), or auto: whatever its checkpoints say."""

    def __post_init__(self):
        if self.framework not in ("auto", *FRAMEWORKS):
            raise ValueError(f"framework must be auto or one of {', '.join(FRAMEWORKS)}, got {self.framework!r}")
        if not self.command:
            raise ValueError("no training command: put it after `--`, e.g. respawn-agent preflight -- python train.py")
        for name in ("steps", "checkpoint_interval_s", "notice_budget_s", "run_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.tolerance < 0:
            raise ValueError(f"tolerance must be >= 0, got {self.tolerance}")


@dataclass
class Run:
    """One run of the command and what it reported."""

    name: str
    process: TrainerProcess
    paths: ChannelPaths
    status: StatusReader
    tail: CheckpointsTail
    metrics: MetricsTail
    log_path: str
    deadline: float  # monotonic time the run is given up on
    trajectory: dict[int, float] = field(default_factory=dict)  # step -> loss, from the metrics and status files
    checkpoints: list[protocol.CheckpointReport] = field(default_factory=list)
    exit_code: int | None = None


class Preflight:
    def __init__(self, config: PreflightConfig, say=print):
        self.config = config
        self.say = say
        self.framework = ""  # what the script's checkpoints say wrote them, once the reference run is done
        self.root = config.work_dir or tempfile.mkdtemp(prefix="respawn-preflight-")
        os.makedirs(self.root, exist_ok=True)

    def run(self) -> None:
        """Raises PreflightFailure with the reason when the script is not spot-safe."""
        cfg = self.config
        reference = self._start("reference", os.path.join(self.root, "ckpt-reference"))
        if cfg.framework != "auto":
            self._refuse_another_framework_early(reference, cfg.framework)
        self._finish(reference)
        self.framework = framework = self._framework(reference, cfg.framework)
        self.say(f"reference: {len(reference.trajectory)} steps sampled, {len(reference.checkpoints)} checkpoint(s), "
                 f"written by {framework}")

        job_ckpt = os.path.join(self.root, "ckpt-interrupted")
        notice = self._start("notice", job_ckpt)
        self._until(notice, lambda: len(notice.checkpoints) >= 2, "two checkpoints")
        before = len(notice.checkpoints)
        self._deliver_notice(notice)
        code = self._wait_exit(notice, cfg.notice_budget_s)
        if code is None:
            notice.process.kill()
            raise PreflightFailure(f"the script did not exit within the notice budget ({cfg.notice_budget_s}s) after SIGTERM and the notice file; output:\n{self._tail(notice)}")
        self._sample(notice)
        if len(notice.checkpoints) == before:
            raise PreflightFailure(f"the script exited (code {code}) after the notice without committing a checkpoint: on a spot VM the work since step {notice.checkpoints[-1].step} would be lost")
        resume_from = notice.checkpoints[-1]
        self._framework(notice, framework)
        self.say(f"notice: checkpoint at step {resume_from.step} committed, exit code {code}")

        resumed = self._start("resume", job_ckpt, resume_from)
        torn = self._kill_mid_save(resumed, job_ckpt, resume_from)
        self._sample(resumed)
        self._check_resumed(resumed, resume_from)
        last = max(resumed.checkpoints, key=lambda c: c.step)
        if torn is not None:
            self.say(f"resume: continued from step {resume_from.step}, killed (SIGKILL) while writing the checkpoint of "
                     f"step {torn}; its newest commit was step {last.step}")
        else:
            why = ("the script's own checkpoints have no manifest to tell a save in progress" if self._named_by(resumed) == OWN_FORMAT
                   else f"each of {SAVES_TO_CATCH} saves was written before it could be caught in the middle")
            self.say(f"resume: continued from step {resume_from.step}, killed (SIGKILL) after a checkpoint at step {last.step} ({why})")

        finish = self._start("finish", job_ckpt, last)
        self._finish(finish)
        self._check_resumed(finish, last)
        self._framework(finish, framework)
        self.say(f"finish: continued from step {last.step} to the end")

        compared = self._compare("loss", lambda r: r.trajectory, reference, [notice, resumed, finish])
        compared += self._compare("checkpoint reference loss", lambda r: {c.step: c.reference_loss for c in r.checkpoints if c.reference_loss is not None}, reference, [notice, resumed, finish])
        if not compared:
            raise PreflightFailure("no step was reported by both the reference and the interrupted runs; report the status at every step (or at least the last) to RESPAWN_STATUS_FILE")

    # --- running the command -------------------------------------------------------
    def _start(self, name: str, checkpoint_uri: str, resume: protocol.CheckpointReport | None = None) -> Run:
        cfg = self.config
        run_dir = os.path.join(self.root, name)
        shutil.rmtree(run_dir, ignore_errors=True)
        paths = ChannelPaths.in_dir(run_dir)
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESPAWN_")}
        env.update(paths.env())
        env.update(
            {
                protocol.ENV_CHECKPOINT_URI: checkpoint_uri,
                protocol.ENV_CHECKPOINT_INTERVAL_S: str(cfg.checkpoint_interval_s),
                protocol.ENV_TOTAL_STEPS: str(cfg.steps),
                "PYTHONUNBUFFERED": "1",
            }
        )
        if resume is not None:
            env[protocol.ENV_RESUME_FROM] = resume.uri
        log_path = os.path.join(run_dir, "output.log")
        run = Run(
            name, TrainerProcess(cfg.command, env=env, cwd=None, log_path=log_path), paths, StatusReader(paths.status), CheckpointsTail(paths.checkpoints),
            MetricsTail(paths.metrics), log_path, deadline=time.monotonic() + cfg.run_timeout_s,
        )
        try:
            run.process.start()
        except OSError as exc:
            raise PreflightFailure(f"could not start {cfg.command!r}: {exc}") from None
        return run

    def _kill_mid_save(self, run: Run, uri: str, resume: protocol.CheckpointReport) -> int | None:
        """After a first commit past `resume` (the run continued), SIGKILL `run` while it
        writes a checkpoint: the step of the one it was writing; or after SAVES_TO_CATCH
        more commits when none was caught in the middle (None)."""
        newer = lambda: [c for c in run.checkpoints if c.step > resume.step]  # noqa: E731
        self._until(run, lambda: bool(newer()), "a checkpoint after resuming")
        if self._named_by(run) == OWN_FORMAT:  # no manifest tells its saves in progress from its commits
            run.process.kill()
            return None
        while (torn := self._torn_step(uri, max(c.step for c in newer()))) is None \
                and len(newer()) <= SAVES_TO_CATCH and run.process.poll() is None:
            self._sample(run)
            time.sleep(POLL_S / 5)
        run.process.kill()
        return torn

    @staticmethod
    def _torn_step(uri: str, after: int) -> int | None:
        """A checkpoint directory past step `after` without its manifest: a save in progress."""
        from respawn.checkpoint import layout

        try:
            names = os.listdir(uri)
        except OSError:
            return None
        for name in names:
            step = layout.parse_step_dir(name)
            if step is not None and step > after and not os.path.exists(os.path.join(uri, name, layout.MANIFEST)):
                return step
        return None

    def _sample(self, run: Run) -> None:
        status = run.status.read()
        step, loss = int_or_none(status.get("step")), finite_or_none(status.get("loss"))
        if step is not None and loss is not None:
            run.trajectory.setdefault(step, loss)
        # The metrics file has every step the script reported; the status file only the latest.
        for point in run.metrics.new_reports():
            if point.loss is not None:
                run.trajectory.setdefault(point.step, point.loss)
        run.checkpoints.extend(run.tail.new_reports())

    def _until(self, run: Run, condition, what: str) -> None:
        while not condition():
            self._sample(run)
            code = run.process.poll()
            if code is not None:
                self._sample(run)
                if condition():
                    return
                raise PreflightFailure(f"{run.name} run: the script exited (code {code}) before {what}; raise --steps or lower --checkpoint-interval-s. Output:\n{self._tail(run)}")
            if time.monotonic() > run.deadline:
                run.process.kill()
                raise PreflightFailure(f"{run.name} run: no {what} within {self.config.run_timeout_s}s (does the script report checkpoints to RESPAWN_CHECKPOINTS_FILE?)")
            time.sleep(POLL_S)

    def _finish(self, run: Run) -> None:
        self._until(run, lambda: run.process.poll() is not None, "the end")
        self._sample(run)  # its last reports, also when it had ended before this wait began
        run.exit_code = run.process.poll()
        if run.exit_code != 0:
            raise PreflightFailure(f"{run.name} run: the script failed on its own (exit code {run.exit_code}). Output:\n{self._tail(run)}")

    def _wait_exit(self, run: Run, timeout_s: float) -> int | None:
        end = time.monotonic() + timeout_s
        while (code := run.process.poll()) is None and time.monotonic() < end:
            self._sample(run)
            time.sleep(POLL_S)
        return code

    def _deliver_notice(self, run: Run) -> None:
        now = datetime.now(timezone.utc)
        deadline = (now + timedelta(seconds=self.config.notice_budget_s)).isoformat()
        write_json_atomic(run.paths.notice, {"source": protocol.NoticeSource.LOCAL, "notice_time": now.isoformat(), "deadline": deadline, "cloud_deadline": deadline})
        run.process.signal(signal.SIGTERM)

    def _tail(self, run: Run) -> str:
        return output_tail(run.log_path, 2000)

    # --- verdicts -----------------------------------------------------------------
    def _framework(self, run: Run, expected: str) -> str:
        """What wrote the run's newest checkpoint: the framework its state.json names, or
        OWN_FORMAT for a script's own checkpoints (checked against `expected` unless auto)."""
        found = self._named_by(run) or "torch"  # checkpoints before DESIGN §11 are the torch loop's
        if expected != "auto" and found != expected:
            raise self._another_framework(run, found, expected)
        return found

    def _refuse_another_framework_early(self, run: Run, expected: str) -> None:
        """A script that saves through another integration fails at its first checkpoint
        that says so, not after a whole run. One rotated away before it was read (or older
        than DESIGN §11) says nothing, and the next is read; one in the script's own format
        is left to the check of the run's newest checkpoint at its end."""
        seen = 0
        while True:
            self._until(run, lambda: len(run.checkpoints) > seen or run.process.poll() is not None, "a checkpoint")
            if len(run.checkpoints) == seen:
                return  # it ended: _finish and _framework say the rest
            seen = len(run.checkpoints)
            found = self._named_by(run)
            if found in (expected, OWN_FORMAT):
                return
            if found is not None:
                run.process.kill()
                raise self._another_framework(run, found, expected)

    def _named_by(self, run: Run) -> str | None:
        """The framework the newest checkpoint's state.json names; None when it names none or
        cannot be read; OWN_FORMAT when it is not a step-N directory at all."""
        from respawn.checkpoint.errors import CheckpointError
        from respawn.checkpoint.reader import ref_from_uri
        from respawn.checkpoint.validate import written_by

        if not run.checkpoints:
            raise PreflightFailure(f"{run.name} run: no checkpoint reported to RESPAWN_CHECKPOINTS_FILE")
        try:
            return written_by(ref_from_uri(self._newest(run).uri))
        except CheckpointError:  # not a step-N directory: the script writes checkpoints of its own
            return OWN_FORMAT

    def _another_framework(self, run: Run, found: str, expected: str) -> PreflightFailure:
        return PreflightFailure(
            f"{run.name} run: checkpoint {self._newest(run).uri} was written by {found!r}, expected {expected!r}: "
            f"does the script save through the {expected} integration (agents/respawn/integrations) every time?")

    @staticmethod
    def _newest(run: Run) -> protocol.CheckpointReport:
        return max(run.checkpoints, key=lambda c: c.step)

    def _check_resumed(self, run: Run, resume: protocol.CheckpointReport) -> None:
        if not run.trajectory:
            raise PreflightFailure(f"{run.name} run: no step reported to RESPAWN_STATUS_FILE after resuming")
        first = min(run.trajectory)
        if first <= resume.step:
            raise PreflightFailure(
                f"{run.name} run: started again at step {first} instead of continuing after step {resume.step} "
                f"(does the script load RESPAWN_RESUME_FROM={resume.uri}?)"
            )

    def _compare(self, what: str, losses, reference: Run, interrupted: list[Run]) -> int:
        """Check `losses(run)` (step -> loss) of the interrupted runs against the reference; the number of steps compared."""
        seen: dict[int, tuple[float, str]] = {}
        for run in interrupted:  # later runs redo steps lost to the SIGKILL: they must agree too
            for step, loss in losses(run).items():
                seen[step] = (loss, run.name)
        expected = losses(reference)
        common = sorted(set(seen) & set(expected))
        for step in common:
            loss, name = seen[step]
            ref = expected[step]
            if abs(loss - ref) > self.config.tolerance * max(1.0, abs(ref)):
                hint = (
                    "the script is not deterministic from scratch: seed every RNG and use torch.use_deterministic_algorithms(True)"
                    if name == "notice"
                    else "after resuming, training does not continue where it stopped: is the optimizer state (and scheduler, RNG, data position) saved and restored?"
                )
                raise PreflightFailure(f"{what} at step {step} is {loss!r} in the {name} run but {ref!r} in the uninterrupted run: {hint}")
        if common:
            self.say(f"same {what} at {len(common)} compared step(s), up to step {common[-1]}")
        return len(common)


def add_preflight_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = PreflightConfig(command=["-"])
    parser.add_argument("--steps", type=int, default=defaults.steps,
                        help="total steps of each run, given to the script as RESPAWN_TOTAL_STEPS (default %(default)s)")
    parser.add_argument("--checkpoint-interval-s", type=float, default=defaults.checkpoint_interval_s,
                        help="RESPAWN_CHECKPOINT_INTERVAL_S of every run: short, so a few saves fit in one run "
                             "(default %(default)s)")
    parser.add_argument("--notice-budget-s", type=float, default=defaults.notice_budget_s,
                        help="seconds the notice run has to commit its save and exit after the SIGTERM; the notice "
                             "file's deadline (default %(default)s: a GCP or Azure notice less the margin)")
    parser.add_argument("--run-timeout-s", type=float, default=defaults.run_timeout_s,
                        help="give up on a run that has not done what it must by then (default %(default)s)")
    parser.add_argument("--tolerance", type=float, default=defaults.tolerance,
                        help="relative difference allowed between the losses of the same step in the uninterrupted "
                             "and the interrupted runs (default %(default)s; 0: bitwise)")
    parser.add_argument("--work-dir", default="", help="keep each run's output and checkpoints here (a temp dir otherwise)")
    parser.add_argument("--framework", default=defaults.framework, choices=("auto", *FRAMEWORKS),
                        help="the kind of script: its checkpoints must say they were written by it (auto: any, all runs alike)")
    parser.add_argument("training_command", nargs=argparse.REMAINDER, help="-- then the command, e.g. -- python train.py")


def run_preflight(args: argparse.Namespace) -> int:
    command = args.training_command[1:] if args.training_command[:1] == ["--"] else args.training_command
    try:
        config = PreflightConfig(
            command=command, steps=args.steps, checkpoint_interval_s=args.checkpoint_interval_s, notice_budget_s=args.notice_budget_s,
            run_timeout_s=args.run_timeout_s, tolerance=args.tolerance, work_dir=args.work_dir, framework=args.framework,
        )
    except ValueError as exc:
        print(f"respawn-agent preflight: {exc}")
        return 2
    preflight = Preflight(config)
    try:
        preflight.run()
    except PreflightFailure as exc:
        print(f"PREFLIGHT FAILED: {exc}\n(runs kept in {preflight.root})")
        return 1
    print(f"PREFLIGHT PASSED: {' '.join(command)} resumes exactly after a notice and after SIGKILL "
          f"({preflight.framework} checkpoints)")
    return 0
