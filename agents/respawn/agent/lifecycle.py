"""The agent's life on one VM: register, run the trainer, heartbeat, act, exit.

    register ──► spawn trainer ──► loop: ship checkpoints, validations, logs, heartbeats
                                         act on heartbeat answers and notices
                                   ──► trainer exits ──► exit report ──► drain journal

A preemption notice (any watcher, or SIGTERM to the agent) is reported at once,
written to the notice file, and turned into the stop signal for the trainer; the
agent then waits until a notice (or final) checkpoint commits or the budget runs
out (the cloud's deadline less a margin: 108 s of AWS's two minutes, 25 s of
GCP's or Azure's 30 s; 25 s from a notice that states no deadline), acknowledges
the event where the cloud wants it (Azure), kills what is left and reports exit.
Everything the agent reports goes through the journal, so nothing here waits on
the control plane except `register`, which cannot proceed without the job spec,
and a gang's rank > 0 that registered before rank 0 did: it heartbeats and polls
`rendezvous` until rank 0's address comes (or the register timeout runs out).

A restarted agent (systemd restarts one that crashed or was killed) finds the
session that register gave it (respawn.agent.session) and resumes instead:

    session ──► heartbeat with the stored token ──► 401: exit EXIT_INSTANCE_ENDED, no trainer
                                                └─► report what the dead trainer committed,
                                                    spawn it to resume from the newest one ──► as above
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta

import requests

from respawn import __version__, protocol, trackers
from respawn.agent import EXIT_INSTANCE_ENDED, container, prepare, session, source
from respawn.agent.channel import (
    ChannelPaths,
    CheckpointsTail,
    LogTail,
    MetricsTail,
    StatusReader,
    ValidationsTail,
    finite_or_none,
    int_or_none,
    last_exception_line,
    output_tail,
    parse_checkpoint_line,
    write_json_atomic,
)
from respawn.agent.client import DELIVERED, REFUSED, ControlPlaneClient, Outcome
from respawn.agent.config import AgentConfig
from respawn.agent.joblog import JobLog
from respawn.agent.reporter import Backoff, Reporter
from respawn.agent.supervisor import TrainerProcess, gang_env, trainer_env
from respawn.agent.validation import Validator
from respawn.journal import Journal
from respawn.notices import PREEMPT, REBALANCE, NoticeEvent, make_watcher, sigterm
from respawn.notices.base import notice_budget_s, utcnow

log = logging.getLogger(__name__)

TRAINER_LOG = "trainer.log"
# How often a spare asks whether it is promoted, and a VM holding a notice for a spare
# heartbeats to hear that it is ready: each hand-over waits at most this long on the ask.
STANDBY_POLL_S = 0.5
# How long a VM holding a notice trains on without the control plane's `hold` (a spare is launching).
HOLD_CONFIRM_S = 10.0
PREPARE_DIR = "prepare"  # under the work dir: the prepare step's outputs ($RESPAWN_PREPARE_DIR)
PREPARE_RESULT = "prepare-result.json"  # under the work dir: how the step went (respawn.agent.prepare)
LOG_POSITION = "log-position.json"  # under the work dir: how much of trainer.log was journaled, for a restart
MAX_EXCEPTION_CHARS = 500  # what the control plane stores
NOTICE_COMMIT_KINDS = (protocol.CheckpointKind.NOTICE, protocol.CheckpointKind.FINAL)
# Once its notice save has committed, what the trainer still does (its teardown: loader workers
# joined, process groups destroyed) is worth nothing to the job and can take seconds of the window.
EXIT_AFTER_NOTICE_COMMIT_S = 1.5
RESUME_VERDICTS = {  # the control plane's word on the resume checkpoint, as the log says it
    protocol.ValidationResult.VALID: "validated",
    protocol.ValidationResult.SKIPPED: "not validated: the job names no validation factories",
    protocol.ValidationResult.PENDING: "not validated yet: it is validated before the trainer loads it",
    protocol.ValidationResult.INVALID: "found invalid: the trainer falls back to an earlier one",
}


class AgentError(Exception):
    """The agent cannot go on (register refused, no job spec); the message says why."""


class InstanceEnded(AgentError):
    """The control plane refused this VM's token (a resumed session's agent token, or
    the bootstrap token at register): the instance is over."""


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and finite_or_none(value) is not None


def check_job_spec(job: protocol.JobSpec) -> None:
    """ValueError naming the first field of the job spec the agent cannot use."""
    if not isinstance(job.command, list) or not job.command or not all(isinstance(a, str) for a in job.command):
        raise ValueError(f"job.command must be a non-empty list of strings, got {job.command!r}")
    for name in ("prepare_command", "prepare_inputs"):
        value = getattr(job, name)
        if not isinstance(value, list) or not all(isinstance(a, str) and a for a in value):
            raise ValueError(f"job.{name} must be a list of non-empty strings, got {value!r}")
    if job.purpose not in protocol.Purpose.ALL:
        raise ValueError(f"job.purpose must be one of {protocol.Purpose.ALL}, got {job.purpose!r}")
    for name in ("env", "secret_env"):
        value = getattr(job, name)
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            # Never the value itself: a secret's would reach the agent's log.
            raise ValueError(f"job.{name} must map strings to strings, got names {sorted(map(str, value)) if isinstance(value, dict) else type(value).__name__}")
    for name in ("heartbeat_interval_s", "notice_budget_s"):
        if not _is_number(getattr(job, name)) or getattr(job, name) <= 0:
            raise ValueError(f"job.{name} must be a number > 0, got {getattr(job, name)!r}")
    if job.checkpoint_interval_s is not None and (not _is_number(job.checkpoint_interval_s) or job.checkpoint_interval_s <= 0):
        raise ValueError(f"job.checkpoint_interval_s must be a number > 0 or null, got {job.checkpoint_interval_s!r}")
    for name in ("rank", "world_size"):
        if not isinstance(getattr(job, name), int) or isinstance(getattr(job, name), bool) or getattr(job, name) < 0:
            raise ValueError(f"job.{name} must be an integer >= 0, got {getattr(job, name)!r}")
    for name in ("checkpoint_uri", "working_dir", "rendezvous_addr", "artifact_uri", "artifact_digest"):
        if not isinstance(getattr(job, name), str):
            raise ValueError(f"job.{name} must be a string, got {getattr(job, name)!r}")
    if not isinstance(job.validation, protocol.ValidationSpec):
        raise ValueError(f"job.validation must be an object, got {job.validation!r}")


def _gang_in(answer: dict) -> tuple[int, int, str, int] | None:
    """(rank, world size, rendezvous, generation) that a `standby` answer names, if usable."""
    rank, world, addr, generation = (answer.get(k) for k in ("rank", "world_size", "rendezvous_addr", "gang_generation"))
    if isinstance(generation, int) and isinstance(rank, int) and isinstance(world, int) and 0 <= rank < world \
            and isinstance(addr, str):
        return rank, world, addr, generation
    return None


def _take_resume(job: protocol.JobSpec, answer: dict) -> None:
    """The checkpoint a `standby` answer names, as where the trainer resumes."""
    resume_step = answer.get("resume_step")
    job.resume_from = answer.get("resume_from") if isinstance(answer.get("resume_from"), str) else None
    job.resume_step = resume_step if isinstance(resume_step, int) else None
    job.resume_validation = str(answer.get("resume_validation") or "")


class Agent:
    def __init__(self, config: AgentConfig):
        self.config = config
        os.makedirs(config.work_dir, mode=0o700, exist_ok=True)
        self.log_path = os.path.join(config.work_dir, TRAINER_LOG)
        self.job_log = JobLog(self.log_path)
        self.paths = ChannelPaths.in_dir(os.path.join(config.work_dir, "channel"))
        self.session_path = os.path.join(config.work_dir, session.SESSION_NAME)
        self.log_position_path = os.path.join(config.work_dir, LOG_POSITION)
        self.client = ControlPlaneClient(config.control_plane_url, timeout_s=config.http_timeout_s)
        self.journal = Journal(os.path.join(config.work_dir, "journal"))
        self.reporter = Reporter(self.journal, self.client, on_answer=self._on_answer, backoff=self._backoff())
        self.watcher = make_watcher(config.provider, config.metadata_url, config.notice_poll_s)
        self.status = StatusReader(self.paths.status)
        self.checkpoints = CheckpointsTail(self.paths.checkpoints)
        self.validations = ValidationsTail(self.paths.validations)
        self.metrics = MetricsTail(self.paths.metrics)
        self.logs: LogTail | None = None  # made once it is known whether this run resumes a session
        self.session: session.Session | None = None
        self.events: queue.Queue = queue.Queue()
        self.stop_watching = threading.Event()
        self.job: protocol.JobSpec | None = None
        self.trainer: TrainerProcess | None = None  # the process being supervised: the prepare step, then the trainer
        self.preparing = False
        self.validator: Validator | None = None
        self.notice: NoticeEvent | None = None
        self.notice_commit: protocol.CheckpointReport | None = None
        self.last_checkpoint: protocol.CheckpointReport | None = None
        self.checkpoint_requested = False  # SIGUSR1 sent, no commit seen since
        self.save_too_slow = False  # the last periodic save would not fit this cloud's notice
        self.commit_journaled_at: datetime | None = None
        self.stopped_by_control_plane = False
        self.kill_at: float | None = None  # monotonic time the trainer is killed if still alive
        self.kill_why = ""  # said in the job's output when it is
        self.hold_until: float | None = None  # monotonic time a notice's save starts at the latest, while held
        self.hold_limit: float | None = None  # hold_until once the control plane confirmed a spare is launching
        self.rebalance_reported = False  # a job with spare_on_rebalance reports the first one only
        self.heartbeat_interval_s = 10.0
        self.checkpoint_interval_s: float | None = None
        # An elastic gang (JobSpec.elastic): the exit code of a trainer that exited on its own while
        # this node waits for the gang's word, and whether a new form of the gang was announced.
        self.trainer_exit_code: int | None = None
        self.regroup_wanted = False

    def _backoff(self) -> Backoff:
        return Backoff(base_s=self.config.backoff_base_s, max_s=self.config.backoff_max_s)

    def _clear_channel(self) -> None:
        """Channel files of an earlier run on this work dir must not be read again."""
        for path in (self.paths.status, self.paths.checkpoints, self.paths.validations, self.paths.control, self.paths.notice,
                     self.paths.metrics):
            if os.path.exists(path):
                os.remove(path)

    def _start_fresh(self) -> None:
        """Nor must its output be reported again."""
        self._clear_channel()
        if os.path.exists(self.log_path):
            os.replace(self.log_path, self.log_path + ".previous")
        if os.path.exists(self.log_position_path):
            os.remove(self.log_position_path)
        self.logs = LogTail(self.log_path)

    # --- entry point ------------------------------------------------------------
    def run(self) -> int:
        with self.job_log:
            return self._run()

    def _run(self) -> int:
        sigterm.install(self._emit)
        try:
            self.session = session.load(self.session_path, check_job_spec)
            if self.session is None:
                self._start_fresh()
                self._begin_session()
            elif self.session.ended:
                return self._deliver_ended_session()
            else:
                self._resume_session()
        except InstanceEnded as exc:
            log.error("%s", exc)
            return EXIT_INSTANCE_ENDED
        except (AgentError, session.SessionError) as exc:
            log.error("%s", exc)
            return 2
        self.reporter.start()
        self.watcher.start(self._emit, self.stop_watching)
        try:
            exit_report = self.supervise()
            self.reporter.report(protocol.PATH_EXIT, exit_report)
            log.info("trainer ended: %s (exit code %s)", exit_report.reason, exit_report.exit_code)
            self.session.ended = True
            self._save_session()
        finally:
            self._shut_down()
        return 0

    def _adopt(self, job: protocol.JobSpec, agent_token: str) -> None:
        self.client.agent_token = agent_token
        self.job = job
        self.heartbeat_interval_s = self.config.heartbeat_interval_s or job.heartbeat_interval_s
        self.checkpoint_interval_s = job.checkpoint_interval_s
        self.status.start_step = job.resume_step or 0

    # --- the session: register, or resume after a restart -----------------------------
    def _begin_session(self) -> None:
        answer = self.register()
        self._adopt(answer.job, answer.agent_token)
        self.session = session.Session(agent_token=answer.agent_token, job=answer.job)
        self._save_session()

    def _save_session(self) -> None:
        assert self.session is not None
        try:
            session.save(self.session_path, self.session)
        except OSError as exc:  # training can go on; only a restart of this agent would suffer
            log.warning("could not write the session file %s: %s; a restarted agent could not resume", self.session_path, exc)

    def _resume_session(self) -> None:
        """Pick up the session of an agent that died on this VM (its trainer died with
        it): make sure the control plane still takes its token, report what the trainer
        committed that the dead agent had not, and point the trainer at the newest of
        those. InstanceEnded when the control plane refused the token."""
        stored = self.session
        assert stored is not None
        self._adopt(stored.job, stored.agent_token)
        self._agent_line(f"resuming session of instance {stored.job.instance_id} after a restart")
        committed = self._committed_by_the_dead_trainer()
        beat = self.status.heartbeat(committed[-1] if committed else None)  # where the dead trainer got to
        self._clear_channel()
        self.logs = LogTail(self.log_path, **self._read_log_position())
        outcome = self._call_until_answered(protocol.PATH_HEARTBEAT, protocol.to_dict(beat), "heartbeat")
        if outcome.kind == REFUSED:
            refusal = f"the control plane refused the stored agent token of instance {stored.job.instance_id} (HTTP {outcome.status}): {outcome.detail[:500]}"
            if outcome.status == 401:
                self._agent_line(f"{refusal}; the instance ended while the agent was down: not restarting the trainer")
                raise InstanceEnded(f"{refusal} (the instance ended or was fenced while the agent was down); exiting without restarting the trainer")
            raise AgentError(refusal)
        for report in committed:  # event_ids follow from the checkpoints: applied once if already delivered
            self.reporter.report(protocol.PATH_CHECKPOINTS, report)
        if committed:
            self.last_checkpoint = newest = max(committed, key=lambda c: c.step)
            if stored.job.resume_step is None or newest.step > stored.job.resume_step:
                # The spec's resume checkpoint is older than what this instance committed since.
                stored.job.resume_from, stored.job.resume_step = newest.uri, newest.step
                stored.job.resume_validation = protocol.ValidationResult.PENDING  # the control plane has not judged it
                self.status.start_step = newest.step
                self._save_session()
            self._agent_line(f"the trainer resumes from the newest checkpoint it committed: step {newest.step}, {newest.uri}")
        answer = outcome.answer or {}
        if answer.get("action") == protocol.Action.CHECKPOINT:
            answer = {**answer, "action": protocol.Action.CONTINUE}  # nothing to checkpoint yet; the answer is repeated
        self._on_heartbeat_answer(answer, "")

    def _committed_by_the_dead_trainer(self) -> list[protocol.CheckpointReport]:
        reports = []
        try:
            with open(self.paths.checkpoints, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return []
        for line in lines:
            try:
                reports.append(parse_checkpoint_line(line))
            except (ValueError, TypeError) as exc:  # a torn last line, or a trainer's bug
                log.warning("skipping an unreadable line of %s (%s): %r", self.paths.checkpoints, exc, line[:500])
        return reports

    def _read_log_position(self) -> dict[str, int]:
        try:
            with open(self.log_position_path) as f:
                doc = json.load(f)
            return {k: int(doc[k]) for k in ("byte_offset", "line_offset")}
        except (OSError, ValueError, KeyError, TypeError):
            return {"byte_offset": 0, "line_offset": 0}

    def _deliver_ended_session(self) -> int:
        """The session ended before this start (a reboot, or a crash after the exit
        report was journaled): deliver what the journal holds, start no trainer."""
        assert self.session is not None
        log.info("the session of instance %s ended before this start; delivering %d journaled report(s), starting no trainer",
                 self.session.job.instance_id, self.journal.pending_count())
        self.client.agent_token = self.session.agent_token
        self.reporter.start()
        self._shut_down()
        return 0

    # --- register -----------------------------------------------------------------
    def register(self) -> protocol.RegisterAnswer:
        body = protocol.to_dict(
            protocol.Register(bootstrap_token=self.config.bootstrap_token, provider_instance_id=self._instance_id(), hostname=socket.gethostname(), agent_version=__version__)
        )
        outcome = self._call_until_answered(protocol.PATH_REGISTER, body, "register")
        if outcome.kind == REFUSED:
            # A refused bootstrap token stays refused: the instance is over for this VM (exit
            # EXIT_INSTANCE_ENDED, which systemd does not restart); anything else is exit 2.
            error = InstanceEnded if outcome.status == 401 else AgentError
            raise error(f"the control plane refused to register this agent (HTTP {outcome.status}): {outcome.detail[:500]} (the bootstrap token is single-use: a VM that registered once cannot register again)")
        return self._parse_register(outcome.answer, outcome.detail)

    def _call_until_answered(self, path: str, body: dict, what: str) -> Outcome:
        """POST `body` until the control plane answers (delivered or refused) or the
        register timeout runs out (AgentError, as does a preemption meanwhile)."""
        backoff, give_up = self._backoff(), time.monotonic() + self.config.register_timeout_s
        while True:
            outcome = self.client.post(path, body)
            if outcome.kind in (DELIVERED, REFUSED):
                return outcome
            if time.monotonic() >= give_up:
                raise AgentError(f"could not {what} with {self.config.control_plane_url} within {self.config.register_timeout_s}s: {outcome.detail[:500]}")
            wait = backoff.next_wait()
            log.info("%s: control plane unavailable (%s %s); retrying in %.2fs", what, outcome.status or "", outcome.detail[:200], wait)
            try:
                event = self.events.get(timeout=wait)
            except queue.Empty:
                continue
            if event[0] == "notice" and event[1].kind == PREEMPT:
                raise AgentError(f"preempted ({event[1].source}) before the control plane answered {what}; nothing to save")

    def _parse_register(self, answer: dict | None, raw: str) -> protocol.RegisterAnswer:
        try:
            parsed = protocol.from_dict(protocol.RegisterAnswer, answer or {})
            if not isinstance(parsed.agent_token, str) or not parsed.agent_token:
                raise ValueError("agent_token is missing or empty")
            if not isinstance(parsed.job, protocol.JobSpec):
                raise ValueError("job is missing")
            check_job_spec(parsed.job)
        except (TypeError, ValueError) as exc:
            raise AgentError(f"the control plane answered register with something unusable ({exc}): {raw[:1000]!r}") from None
        return parsed

    def _instance_id(self) -> str:
        try:
            return getattr(self.watcher, "instance_id")()
        except (requests.RequestException, AttributeError) as exc:
            log.info("could not read the instance id from %s: %s", self.config.metadata_url, exc)
            return ""

    # --- the supervision loop ---------------------------------------------------------
    def supervise(self) -> protocol.ExitReport:
        job = self.job
        assert job is not None
        if self.stopped_by_control_plane:  # a resumed session's first heartbeat was answered `stop`
            return self._exit_report(None)
        try:
            env = trainer_env(job, self.paths.env())
        except ValueError as exc:
            return self._setup_failure(f"could not start the trainer {job.command!r}: {exc}", str(exc))
        if source.wanted(job):
            ended = self._put_source_in_place()
            if ended is not None:
                return ended
        self._start_validator(env)
        if job.prepare_command:
            ended = self._prepare(env)
            if ended is not None:
                return ended
        if job.world_size > 1 and job.rank > 0 and not job.rendezvous_addr:
            ended = self._await_rendezvous()
            if ended is not None:
                return ended
            try:
                env.update(gang_env(job))
            except ValueError as exc:
                return self._setup_failure(f"could not start the trainer {job.command!r}: {exc}", str(exc))
        if job.standby:
            ended = self._await_promotion()
            if ended is not None:
                return ended
            if job.resume_from:
                env[protocol.ENV_RESUME_FROM] = job.resume_from
        self._validate_resume_checkpoint()
        if trackers.wants_mlflow_run(env, {**job.env, **job.secret_env}):
            self._find_mlflow_run(env)
        while True:
            if self.regroup_wanted or self.trainer_exit_code is not None:
                ended = self._join_the_regrouped_gang()
                if ended is not None:
                    return ended
                env.pop(protocol.ENV_RESUME_FROM, None)
                if job.resume_from:
                    env[protocol.ENV_RESUME_FROM] = job.resume_from
            try:
                env.update(gang_env(job))
                if self.checkpoint_interval_s:
                    write_json_atomic(self.paths.control, {"checkpoint_interval_s": self.checkpoint_interval_s})
                if job.container_image:
                    self.trainer, ended = self._container_trainer(env)
                    if ended is not None:
                        return ended
                else:
                    self.trainer = TrainerProcess(job.command, env=env, cwd=job.working_dir, log_path=self.log_path)
                self._say_where_it_resumes()
                self.trainer.start()
            except (OSError, ValueError) as exc:
                return self._setup_failure(f"could not start the trainer {job.command!r}: {exc}", str(exc))
            code = self._watch()
            self._collect_checkpoints()
            self._ship_metrics()
            if not job.elastic or self.notice is not None or self.stopped_by_control_plane or (code == 0 and not self.regroup_wanted):
                break
            if not self.regroup_wanted:
                # A peer gone breaks the gang's collectives, and so does a bug: the control plane
                # tells which (respawn_server.jobs.fleet.reconciler.check_elastic_gang).
                self.trainer_exit_code = code
                self._agent_line(f"the trainer exited (code {code}); as a node of an elastic gang, waiting for the "
                                 "control plane's word: a peer lost (the gang goes on without it) or the code failed "
                                 "(the gang stops)")
        if self.notice is not None:
            self._report_notice_outcome()
        elif job.container_image and not self.stopped_by_control_plane:
            tail = output_tail(self.log_path)
            failure = container.runtime_failure(code, tail)
            if failure:
                self._ship_logs(final=True)
                return self._setup_failure(tail, f"container image {job.container_image}: {failure} (exit {code})")
        return self._exit_report(code)

    def _start_validator(self, env: dict[str, str]) -> None:
        """Warm from now (torch imported, the device's context made) for the first checkpoint,
        which then validates at once: a spare is warm before it is promoted."""
        job, config = self.job, self.config
        if config.validate and job.validation.enabled and job.validation.model_factory and job.validation.batch_factory:
            self.validator = Validator(command=config.validate_command, serve_command=config.validate_serve_command,
                                       timeout_s=config.validate_timeout_s, spec=job.validation, env=dict(env),
                                       cwd=job.working_dir or None, on_result=self._report_validation)

    def _validate_resume_checkpoint(self) -> None:
        """A resume checkpoint not judged yet (a notice save, just committed) checked now, while
        the trainer starts: its recorded verdict spares the trainer the check it would make
        before loading it (respawn.checkpoint.resume)."""
        job = self.job
        if self.validator is not None and job.resume_from and job.resume_validation not in (
                protocol.ValidationResult.VALID, protocol.ValidationResult.INVALID):
            self.validator.submit(protocol.CheckpointReport(checkpoint_id="", step=job.resume_step or 0,
                                                            uri=job.resume_from, bytes=0, manifest_digest=""))

    def _container_trainer(self, env: dict[str, str]) -> tuple[TrainerProcess, protocol.ExitReport | None]:
        """The trainer in the job's container image (respawn.agent.container), once the image
        is on the VM: pulled under the same watch as the trainer (heartbeats, notices), an
        image that cannot be pulled being the job's setup failure."""
        job = self.job
        runtime = container.find_runtime(env.get("PATH"))
        pull = TrainerProcess(container.pull_argv(runtime, job.container_image), env=env, cwd=None,
                              log_path=self.log_path)
        self.trainer, self.preparing = pull, True  # nothing to checkpoint while pulling; SIGTERM stops it
        try:
            pull.start()
            code = self._watch()
        finally:
            self.preparing = False
        if self.notice is not None or self.stopped_by_control_plane:
            return pull, self._exit_report(code)
        if code != 0:
            self._ship_logs(final=True)
            return pull, self._setup_failure(output_tail(self.log_path), f"container image {job.container_image} "
                                             f"could not be pulled with {runtime} (exit {code})")
        checkpoints = container.local_dir(job.checkpoint_uri)
        if checkpoints:
            os.makedirs(checkpoints, exist_ok=True)  # a bind mount needs its source
        name = container.container_name(job.instance_id)
        argv = container.run_argv(runtime=runtime, image=job.container_image, name=name, command=job.command,
                                  env=env, cwd=job.working_dir or None,
                                  mounts=[job.working_dir, self.config.work_dir, checkpoints])
        return container.ContainerTrainer(argv, runtime=runtime, name=name, env=env, log_path=self.log_path), None

    def _watch(self) -> int:
        """Supervise `self.trainer` (the prepare step, then the trainer) until it exits:
        ship its checkpoints, output and heartbeats, act on answers and notices."""
        assert self.trainer is not None
        now = time.monotonic()
        next_heartbeat, next_logs = now, now + self.config.log_batch_interval_s
        while True:
            self._collect_checkpoints()
            code = self.trainer.poll()
            if code is not None:
                self.trainer.kill()  # what it left behind: loader workers, ranks in sessions of their own
                return code
            now = time.monotonic()
            if self.kill_at is not None and now >= self.kill_at:
                self._agent_line(self.kill_why)
                self.trainer.kill()
                continue
            if self.hold_until is not None and now >= self.hold_until:
                self._stop_for_notice(report=False)
            if now >= next_logs:
                self._ship_logs()
                next_logs = now + self.config.log_batch_interval_s
            if now >= next_heartbeat:
                self.reporter.report(protocol.PATH_HEARTBEAT, self._heartbeat())
                self._ship_metrics()
                # While a notice is held, the control plane's word that the spare is ready must come soon.
                next_heartbeat = now + (min(STANDBY_POLL_S, self.heartbeat_interval_s) if self.hold_until is not None else self.heartbeat_interval_s)
            try:
                event = self.events.get(timeout=self.config.tick_s)
            except queue.Empty:
                continue
            self._handle(event)

    def _prepare(self, env: dict[str, str]) -> protocol.ExitReport | None:
        """Run the job's prepare step (respawn.agent.prepare) under the same watch as the
        trainer; on success `env` tells the trainer where its outputs are. An exit report
        when the job cannot go on here (the step failed, a notice or a stop came first)."""
        job = self.job
        assert job is not None
        out_dir, result_path = os.path.join(self.config.work_dir, PREPARE_DIR), os.path.join(self.config.work_dir, PREPARE_RESULT)
        if os.path.exists(result_path):
            os.remove(result_path)
        env[protocol.ENV_PREPARE_DIR] = out_dir
        command = prepare.runner_command(job, out_dir=out_dir, result=result_path, store=job.rank == 0)
        self.preparing = True
        try:
            self.trainer = TrainerProcess(command, env=env, cwd=None, log_path=self.log_path)
            self.trainer.start()
            code = self._watch()
        except OSError as exc:
            return self._setup_failure(f"could not start the prepare step: {exc}", str(exc))
        finally:
            self.preparing = False
        if self.notice is not None or self.stopped_by_control_plane:
            return self._exit_report(code)
        result = prepare.read_result(result_path)
        self.reporter.report(protocol.PATH_PREPARE, protocol.PrepareReport(
            outcome=result.outcome, key=result.key, uri=result.uri, seconds=result.seconds, message=result.message))
        if code != 0:
            self._ship_logs(final=True)
            return protocol.ExitReport(reason=protocol.ExitReason.SETUP, exit_code=code, output_tail=output_tail(self.log_path),
                                       last_exception=f"prepare step failed: {result.message}"[:MAX_EXCEPTION_CHARS])
        env[protocol.ENV_PREPARE_URI] = result.uri
        self.trainer = None
        return None

    def _await_rendezvous(self) -> protocol.ExitReport | None:
        """A rank > 0 that registered before rank 0 has no rendezvous address yet (on a
        cloud it is known only once rank 0 registers): ask for it until it comes. It
        sets `self.job.rendezvous_addr`; an exit report as `_poll_until`'s, or when no
        address came within the register timeout."""
        job = self.job
        assert job is not None
        self._agent_line(f"rank {job.rank} of {job.world_size}: waiting for rank 0 to register and give its rendezvous address")

        def arrived(answer: dict) -> bool:
            addr = answer.get("rendezvous_addr")
            if not isinstance(addr, str):
                log.warning("rendezvous answer with an unusable rendezvous_addr, ignored: %r", answer)
            elif addr:
                job.rendezvous_addr = addr
                self._agent_line(f"rank 0's rendezvous address: {addr}")
                return True
            return False

        return self._poll_until(protocol.PATH_RENDEZVOUS, "rendezvous", arrived, self.heartbeat_interval_s,
                                give_up=(self.config.register_timeout_s, f"rank {job.rank} got no rendezvous address within {self.config.register_timeout_s}s: rank 0 did not register"))

    def _await_promotion(self) -> protocol.ExitReport | None:
        """A spare (docs/spares.md), booted and prepared during another VM's notice, or a
        joiner of an elastic gang (docs/elastic.md): ask `standby` every STANDBY_POLL_S until
        this one is promoted (that VM has ended, or the gang regrouped with it), then take the
        checkpoint, and a joiner its rank, world size and rendezvous, that the answer names.
        No limit here: the control plane releases one it will not need (the `stop` this loop
        ends on)."""
        job = self.job
        assert job is not None
        self._agent_line("standing by: prepared; training once promoted (a spare: after the noticed VM's checkpoint; "
                         "a joiner: when its gang regroups with it at a checkpoint)")

        def promoted(answer: dict) -> bool:
            if answer.get("standby") is not False:
                return False
            _take_resume(job, answer)
            gang = _gang_in(answer) if job.elastic else None
            if gang is not None:
                job.rank, job.world_size, job.rendezvous_addr, job.gang_generation = gang
                self.regroup_wanted = False  # this is the regroup its heartbeat may have announced
            job.standby = False
            self.status.start_step = job.resume_step or 0
            return True

        return self._poll_until(protocol.PATH_STANDBY, "standby", promoted, STANDBY_POLL_S)

    def _join_the_regrouped_gang(self) -> protocol.ExitReport | None:
        """An elastic gang's node whose trainer exited, on its own or stopped for a regroup:
        ask `standby` until it names a new generation of the gang, and take this node's rank,
        world size, rendezvous and resume checkpoint from it (kept in the session, so a
        restarted agent trains there too). None when the trainer may restart; else the
        exit report: told to stop (a failed trainer's with its own code and output), a
        notice, or no word within the register timeout."""
        job = self.job
        assert job is not None
        give_up_at = time.monotonic() + self.config.register_timeout_s
        gave_up = False

        def regrouped(answer: dict) -> bool:
            nonlocal gave_up
            generation = answer.get("gang_generation")
            if isinstance(generation, int) and generation > job.gang_generation:
                gang = _gang_in(answer)
                if gang is not None:
                    job.rank, job.world_size, job.rendezvous_addr, job.gang_generation = gang
                    _take_resume(job, answer)
                    return True
                log.warning("standby answer with an unusable gang, ignored: %r", answer)
            gave_up = time.monotonic() >= give_up_at
            return gave_up

        ended = self._poll_until(protocol.PATH_STANDBY, "standby", regrouped, STANDBY_POLL_S)
        if gave_up:
            self._agent_line(f"no word from the control plane within {self.config.register_timeout_s}s; reporting the trainer's exit")
        if gave_up or ended is not None and self.notice is None:
            return self._exit_report(self.trainer_exit_code)
        if ended is not None:
            return ended
        self.trainer_exit_code, self.regroup_wanted, self.checkpoint_requested = None, False, False
        self.status.start_step = job.resume_step or 0
        if os.path.exists(self.paths.status):
            os.remove(self.paths.status)  # the stopped trainer's step is not where the new one starts
        self._save_session()
        self._agent_line(f"the gang regrouped (generation {job.gang_generation}): rank {job.rank} of {job.world_size}, "
                         f"rendezvous {job.rendezvous_addr or '(rank 0 not registered yet)'}; restarting the trainer")
        if job.rank > 0 and not job.rendezvous_addr:
            return self._await_rendezvous()
        return None

    def _poll_until(self, path: str, what: str, done, every_s: float,
                    give_up: tuple[float, str] | None = None) -> protocol.ExitReport | None:
        """GET `path` every `every_s` until `done(answer)`, heartbeating meanwhile so this
        instance is not taken for lost. None once done; else an exit report: a notice or
        a stop came first, the control plane refused the call, or `give_up`'s seconds
        passed (a setup failure with its message)."""
        give_up_at = time.monotonic() + give_up[0] if give_up else None
        next_poll = time.monotonic()
        next_beat = next_poll
        while not (self.notice or self.stopped_by_control_plane):
            now = time.monotonic()
            if now >= next_poll:
                if now >= next_beat:
                    self.reporter.report(protocol.PATH_HEARTBEAT, self._heartbeat())
                    next_beat = now + self.heartbeat_interval_s
                outcome = self.client.get(path)
                if outcome.kind == DELIVERED and isinstance(outcome.answer, dict) and done(outcome.answer):
                    return None
                if outcome.kind == REFUSED:
                    return self._setup_failed(f"the control plane refused the {what} call (HTTP {outcome.status}): {outcome.detail[:500]}")
                if give_up_at is not None and now >= give_up_at:
                    return self._setup_failed(give_up[1])
                next_poll = time.monotonic() + every_s
            try:
                event = self.events.get(timeout=max(0.0, min(self.config.tick_s, next_poll - time.monotonic())))
            except queue.Empty:
                continue
            self._handle(event)
        if self.notice is not None:
            self._report_notice_outcome()
        return self._exit_report(None)

    def _put_source_in_place(self) -> protocol.ExitReport | None:
        """The job's code into working_dir (respawn.agent.source), in a thread while this one
        heartbeats (a long download must not look like a lost VM) and handles notices. A
        setup failure saying why when it cannot be done; an exit report when a notice or a
        stop came first."""
        job = self.job
        assert job is not None
        self._agent_line(f"putting the job's code in place: {source.describe(job)}")
        done: dict[str, str] = {}

        def put() -> None:
            try:
                done["dir"] = source.put_in_place(job, self.client, self.config.work_dir, backoff=self._backoff(),
                                                  give_up_s=self.config.register_timeout_s)
            except source.SourceFailed as exc:
                done["failed"] = str(exc)

        worker = threading.Thread(target=put, name="source", daemon=True)
        worker.start()
        next_heartbeat = time.monotonic()
        while worker.is_alive() and not (self.notice or self.stopped_by_control_plane):
            if time.monotonic() >= next_heartbeat:
                self.reporter.report(protocol.PATH_HEARTBEAT, self._heartbeat())
                next_heartbeat = time.monotonic() + self.heartbeat_interval_s
            try:
                self._handle(self.events.get(timeout=self.config.tick_s))
            except queue.Empty:
                continue
        if worker.is_alive():  # a notice or a stop came first; the thread dies with the agent
            if self.notice is not None:
                self._report_notice_outcome()
            return self._exit_report(None)
        if "dir" not in done:
            return self._setup_failed(f"setup failed: {done.get('failed', 'the source step ended without a word')}")
        job.working_dir = done["dir"]
        self._save_session()  # a restarted agent runs the trainer there too
        self._agent_line(f"the job's code is in {job.working_dir}")
        return None

    def _setup_failed(self, message: str) -> protocol.ExitReport:
        self._agent_line(message)
        self._ship_logs(final=True)
        return self._setup_failure(output_tail(self.log_path), message)

    def _setup_failure(self, tail: str, exception: str) -> protocol.ExitReport:
        return protocol.ExitReport(reason=protocol.ExitReason.SETUP, output_tail=tail, last_exception=exception[:MAX_EXCEPTION_CHARS])

    def _handle(self, event: tuple) -> None:
        if event[0] == "notice":
            self._on_notice(event[1])
        elif event[0] == "answer":
            self._on_heartbeat_answer(event[1], event[2])

    def _emit(self, notice: NoticeEvent) -> None:
        self.events.put(("notice", notice))

    def _on_answer(self, path: str, answer: dict | None, sent: dict) -> None:
        if path == protocol.PATH_HEARTBEAT and answer is not None:
            self.events.put(("answer", answer, sent.get("sent_at", "")))

    # --- notices ------------------------------------------------------------------
    def budget_s(self) -> float:
        assert self.job is not None
        return self.config.notice_budget_s or self.job.notice_budget_s

    def _on_notice(self, notice: NoticeEvent) -> None:
        if notice.kind == REBALANCE:
            self._on_rebalance(notice)
            return
        if self.notice is not None:
            log.info("another notice (%s) while handling one from %s; already stopping", notice.source, self.notice.source)
            return
        self.notice = notice
        stated = notice.deadline or notice.notice_time + timedelta(seconds=self.budget_s())
        hold_s = notice.budget_s(self.budget_s()) - self.budget_s()
        if self.job is not None and self.job.notice_hold and hold_s > 0 and self.trainer is not None and not self.preparing:
            # A spare may boot meanwhile (docs/spares.md): train on until the control plane says
            # it is ready (checkpoint_and_stop), at the latest when only the save's budget is left,
            # and only briefly unless it says one is launching (`hold`).
            self.hold_limit = time.monotonic() + hold_s
            self.hold_until = min(self.hold_limit, time.monotonic() + HOLD_CONFIRM_S)
            self.reporter.report(
                protocol.PATH_NOTICE,
                protocol.Notice(source=notice.source, notice_time=notice.notice_time.isoformat(), deadline=stated.isoformat(), raw=notice.raw),
            )
            self._agent_line(f"preemption notice from {notice.source}, deadline {stated.isoformat()}: training on while a spare boots, checkpointing and stopping within {hold_s:.1f}s")
            return
        self._stop_for_notice(report=True)

    def _on_rebalance(self, notice: NoticeEvent) -> None:
        """Said in the job's output. Most rebalance recommendations are not followed by a
        preemption, so training goes on; a job with spare_on_rebalance has the control plane
        told (the first time), which launches a spare and, once it is ready, asks this VM to
        checkpoint and stop: a planned move (docs/spares.md)."""
        self._agent_line(f"rebalance recommendation from {notice.source}: {notice.raw}")
        if self.config.checkpoint_on_rebalance:
            self._signal_trainer(protocol.SIGNAL_CHECKPOINT_NOW)
        if self.job is not None and self.job.spare_on_rebalance and not self.rebalance_reported and self.notice is None:
            self.rebalance_reported = True
            self.reporter.report(protocol.PATH_NOTICE, protocol.Notice(
                source=notice.source, notice_time=notice.notice_time.isoformat(), raw=notice.raw,
                kind=protocol.NoticeKind.REBALANCE))
            self._agent_line("training on while a spare boots to move the job to, on the rebalance recommendation")

    def _stop_for_notice(self, report: bool) -> None:
        """Checkpoint and stop within what is left of the notice's budget (`report`: tell
        the control plane of the notice too, unless done when the hold began)."""
        notice = self.notice
        assert notice is not None
        self.hold_until = None
        budget = notice.budget_s(self.budget_s())
        working_deadline = utcnow() + timedelta(seconds=budget)
        stated = notice.deadline or notice.notice_time + timedelta(seconds=self.budget_s())
        # The trainer first: the journal's fsync can take a while when a
        # checkpoint is being written to the same disk, the report can wait for it.
        write_json_atomic(
            self.paths.notice,
            {"source": notice.source, "notice_time": notice.notice_time.isoformat(), "deadline": working_deadline.isoformat(), "cloud_deadline": notice.deadline.isoformat() if notice.deadline else None},
        )
        self._signal_trainer(self.config.stop_signal)
        self.kill_at = time.monotonic() + budget
        self.kill_why = f"the trainer did not stop within the notice's {budget:.1f}s; killing it"
        if report:
            self.reporter.report(
                protocol.PATH_NOTICE,
                protocol.Notice(source=notice.source, notice_time=notice.notice_time.isoformat(), deadline=stated.isoformat(), raw=notice.raw),
            )
        if self.validator is not None:
            self.validator.stop()  # the CPU is the notice save's now
            self.validator = None
        self._agent_line(f"preemption notice from {notice.source}, deadline {stated.isoformat()}: checkpointing and stopping within {budget:.1f}s")

    def _on_notice_commit(self, report: protocol.CheckpointReport) -> None:
        self.notice_commit = report
        if report.kind == protocol.CheckpointKind.NOTICE and \
                (self.kill_at is None or self.kill_at > time.monotonic() + EXIT_AFTER_NOTICE_COMMIT_S):
            # Not a final one: its validation and export follow.
            self.kill_at = time.monotonic() + EXIT_AFTER_NOTICE_COMMIT_S
            self.kill_why = f"the trainer did not exit within {EXIT_AFTER_NOTICE_COMMIT_S:g}s of its notice commit; ending it"
        if self.notice is not None and self.notice.acknowledge is not None:
            try:
                self.notice.acknowledge()
            except requests.RequestException as exc:
                log.warning("could not acknowledge the %s event: %s", self.notice.source, exc)

    def _report_notice_outcome(self) -> None:
        if self.notice_commit is not None:
            self._agent_line(f"notice checkpoint committed at step {self.notice_commit.step}: {self.notice_commit.uri}")
        elif self.job is not None and self.job.rank > 0:
            self._agent_line(f"rank {self.job.rank} stopped; rank 0 commits and reports the gang's notice checkpoint")
        else:
            self._agent_line("no checkpoint committed within the notice budget; the job resumes from its previous checkpoint")

    # --- heartbeat answers ----------------------------------------------------------
    def _on_heartbeat_answer(self, answer: dict, heartbeat_sent_at: str) -> None:
        action = answer.get("action", protocol.Action.CONTINUE)
        if action not in protocol.Action.ALL:
            log.warning("heartbeat answer with an unknown action, ignored: %r", answer)
            action = protocol.Action.CONTINUE
        interval = finite_or_none(answer.get("checkpoint_interval_s"))
        if interval is not None and interval > 0 and interval != self.checkpoint_interval_s:
            self.checkpoint_interval_s = interval
            write_json_atomic(self.paths.control, {"checkpoint_interval_s": interval})
        elif answer.get("checkpoint_interval_s") is not None and interval is None:
            log.warning("heartbeat answer with an unusable checkpoint_interval_s, ignored: %r", answer)
        heartbeat = finite_or_none(answer.get("heartbeat_interval_s"))
        if heartbeat is not None and heartbeat > 0:
            self.heartbeat_interval_s = heartbeat
        # Generations only grow: the answer to a heartbeat sent before a regroup may still name the older one.
        generation = answer.get("gang_generation")
        if self.job is not None and self.job.elastic and isinstance(generation, int) and \
                generation > self.job.gang_generation and not self.regroup_wanted:
            self.regroup_wanted = True
            if self.trainer is not None and not self.preparing and self.trainer.poll() is None:
                # Its gang lost a node (its collectives are broken or soon will be) or regroups:
                # nothing can be saved together, so the trainer goes now and restarts in the new gang.
                self._agent_line(f"the gang regroups (generation {generation}): stopping the trainer to restart it there")
                self.trainer.kill()
        if self.hold_until is not None and action in (protocol.Action.CHECKPOINT_AND_STOP, protocol.Action.STOP):
            self._agent_line("the spare is ready: checkpointing and stopping")
            self._stop_for_notice(report=False)
        elif self.hold_until is not None and action == protocol.Action.HOLD and self.hold_until != self.hold_limit:
            self.hold_until = self.hold_limit
            self._agent_line("a spare is launching: training on until it is ready")
        elif action == protocol.Action.CHECKPOINT and self._checkpoint_wanted(heartbeat_sent_at) \
                and os.path.exists(self.paths.status):
            # Only a trainer that has reported (its status file) has the library's SIGUSR1 handler:
            # one still importing would die of it. The answer is repeated until a commit.
            self.checkpoint_requested = True
            self._signal_trainer(protocol.SIGNAL_CHECKPOINT_NOW)
        elif action in (protocol.Action.CHECKPOINT_AND_STOP, protocol.Action.STOP) and not (self.stopped_by_control_plane or self.notice):
            self.stopped_by_control_plane = True
            grace = self.budget_s() if action == protocol.Action.CHECKPOINT_AND_STOP else self.config.stop_grace_s
            self._signal_trainer(self.config.stop_signal)
            self.kill_at = time.monotonic() + grace
            self.kill_why = f"the trainer did not stop within {grace:.1f}s of the control plane's {action}; killing it"
            self._agent_line(f"control plane asked to {action}; stopping the trainer within {grace:.1f}s")

    def _heartbeat(self) -> protocol.Heartbeat:
        beat = self.status.heartbeat(self.last_checkpoint)
        if self.trainer_exit_code is not None:
            beat.trainer_exit_code, beat.gang_generation = self.trainer_exit_code, self.job.gang_generation
        return beat

    def _checkpoint_wanted(self, heartbeat_sent_at: str) -> bool:
        """A `checkpoint` answer is repeated until the control plane sees a commit:
        act on it once, not again for heartbeats sent before the commit it asked for."""
        if self.checkpoint_requested:
            return False
        if self.commit_journaled_at is not None and heartbeat_sent_at:
            # Heartbeats made after the commit was journaled reach the control plane after it.
            return datetime.fromisoformat(heartbeat_sent_at) > self.commit_journaled_at
        return True

    def _signal_trainer(self, name: str) -> None:
        if self.preparing:
            # The prepare step has nothing to checkpoint, and SIGUSR1 would kill it; it stops on SIGTERM.
            if name == protocol.SIGNAL_CHECKPOINT_NOW:
                return
            name = "SIGTERM"
        if self.trainer is not None:
            self.trainer.signal(getattr(signal, name))

    # --- reports from the trainer ------------------------------------------------------
    def _collect_checkpoints(self) -> None:
        for report in self.checkpoints.new_reports():
            report.notice_window_s = self.config.notice_window_s or self.watcher.window_s
            self._check_save_fits_the_notice(report)
            # Every step up to the save first: a notice save's report ends the VM at once when
            # a spare takes over, and an ended VM's metrics are refused (the curve lost them).
            self._ship_metrics()
            self.reporter.report(protocol.PATH_CHECKPOINTS, report)
            self.last_checkpoint = report
            self.commit_journaled_at = utcnow()
            self.checkpoint_requested = False
            if self.notice is not None and self.notice_commit is None and report.kind in NOTICE_COMMIT_KINDS:
                self._on_notice_commit(report)
            elif self.validator is not None and report.kind != protocol.CheckpointKind.FINAL:
                # The trainer validates its final checkpoint itself, before exporting it.
                self.validator.submit(report)
        for checkpoint_id, verdict in self.validations.new_reports():  # on resume, before export
            self._report_validation(checkpoint_id, verdict)
        if self.validator is not None:
            self.validator.poll()

    def _check_save_fits_the_notice(self, report: protocol.CheckpointReport) -> None:
        """Say in the job's output, before any notice comes, when a periodic save (its
        time less the pacing) would not fit the budget this cloud's notice leaves; and
        when it fits again. The control plane shows it on the job page too."""
        window = report.notice_window_s
        if window is None or report.persist_s is None or report.kind != protocol.CheckpointKind.PERIODIC:
            return
        budget = notice_budget_s(window)
        too_slow = report.persist_s > budget
        if too_slow == self.save_too_slow:
            return
        self.save_too_slow = too_slow
        if too_slow:
            self._agent_line(f"warning: the save of step {report.step} took {report.persist_s:.0f} s to persist; "
                             f"{self.config.provider} gives {window:.0f} s of notice ({budget:.0f} s to save): "
                             "a notice save would not commit in time (a smaller state or faster storage would)")
        else:
            self._agent_line(f"the save of step {report.step} took {report.persist_s:.0f} s: it fits {self.config.provider}'s notice again")

    def _report_validation(self, checkpoint_id: str, report: protocol.ValidationReport) -> None:
        self.reporter.report(protocol.PATH_VALIDATION.format(checkpoint_id=checkpoint_id), report)

    def _ship_logs(self, final: bool = False) -> None:
        assert self.logs is not None
        while batches := self.logs.batches(final=final):
            for batch in batches:
                self.reporter.report(protocol.PATH_LOGS, batch)
            # After the journal has them: a restarted agent ships from here, with the offsets going on.
            write_json_atomic(self.log_position_path, self.logs.position())
            if not final:
                return

    def _find_mlflow_run(self, env: dict[str, str]) -> None:
        """Set MLFLOW_RUN_ID to the job's MLflow run (respawn.trackers), in a child process with a
        time limit: a slow or absent tracking server must not hold the VM. Without it the
        trainer still runs, logging to a run of its own, and the job's output says why."""
        argv = [sys.executable, "-m", "respawn.trackers", "mlflow-run", *(["--wait"] if self.job.rank > 0 else [])]
        try:
            done = subprocess.run(argv, env=env, cwd=self.job.working_dir or None, capture_output=True, text=True,
                                  timeout=trackers.MLFLOW_RESOLVE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._agent_line(f"the MLflow tracking server did not answer within {trackers.MLFLOW_RESOLVE_TIMEOUT_S:.0f}s; "
                             "this VM's trainer logs to an MLflow run of its own")
            return
        run_id = done.stdout.strip()
        if done.returncode != 0 or not run_id:
            why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1][:300]
            self._agent_line(f"could not find or create the job's MLflow run ({why}); this VM's trainer logs to an MLflow run of its own")
            return
        env["MLFLOW_RUN_ID"] = run_id
        self._agent_line(f"MLflow run {run_id} ({trackers.MLFLOW_TAG}={env[trackers.ENV_RUN_ID]})")

    def _ship_metrics(self) -> None:
        if batch := self.metrics.batch():
            self.reporter.report(protocol.PATH_METRICS, batch)

    def _say_where_it_resumes(self) -> None:
        """Whoever reads the log learns where this VM's training picks up and whether
        that checkpoint was found sound."""
        job = self.job
        if not job.resume_from or job.purpose != protocol.Purpose.TRAIN:
            return
        verdict = RESUME_VERDICTS.get(job.resume_validation, job.resume_validation or "validation unknown")
        self._agent_line(f"resumed from step {job.resume_step} (checkpoint {job.resume_from}, {verdict})")

    def _agent_line(self, message: str) -> None:
        """A line in the job's output (shipped with it), so users see what the agent did and why."""
        self.job_log.say(log, message)

    def _exit_report(self, code: int | None) -> protocol.ExitReport:
        """How the trainer ended (`code` None: it never started, a notice or a stop came first)."""
        status = self.status.read()
        if self.notice is not None:
            reason = protocol.ExitReason.PREEMPTED
        elif self.trainer_exit_code is not None:  # an elastic gang's trainer failed before the control plane's word
            reason = protocol.ExitReason.FAILED
        elif self.stopped_by_control_plane or status.get("stopped") is True:
            # The second case: a gang's rank stopped with the rank that was asked to stop, its
            # save done, whatever its exit code: gloo's teardown, a peer gone first, aborts a
            # process now and then (exit -6) after training is over and nothing is lost.
            reason = protocol.ExitReason.STOPPED
        elif code != 0 and self._final_commit() is not None:
            # A launcher's exit code (torchrun's, after a rank's teardown went wrong) says less
            # than what the ranks committed: the final checkpoint is the end of training.
            reason = protocol.ExitReason.COMPLETED
            self._agent_line(f"the trainer's command exited {code} after its final checkpoint (step "
                             f"{self._final_commit().step}) committed: training is complete, nothing was lost")
        else:
            reason = protocol.ExitReason.COMPLETED if code == 0 else protocol.ExitReason.FAILED
        self._ship_logs(final=True)
        tail = output_tail(self.log_path)
        return protocol.ExitReport(
            reason=reason,
            exit_code=code,
            final_step=int_or_none(status.get("step")),
            output_tail=tail,
            last_exception=last_exception_line(tail)[:MAX_EXCEPTION_CHARS] if reason == protocol.ExitReason.FAILED else "",
            artifact_uri=str(status.get("artifact_uri") or ""),
            artifact_digest=str(status.get("artifact_digest") or ""),
        )

    def _final_commit(self) -> protocol.CheckpointReport | None:
        last = self.last_checkpoint
        return last if last is not None and last.kind == protocol.CheckpointKind.FINAL else None

    def _shut_down(self) -> None:
        self.stop_watching.set()
        if self.validator is not None:
            self.validator.stop()
        if self.trainer is not None and self.trainer.poll() is None:
            self.trainer.kill()
        if not self.reporter.drain(self.config.drain_timeout_s):
            log.warning("%d report(s) not delivered yet; they stay in %s", self.journal.pending_count(), self.journal.directory)
        self.reporter.stop()
        self.journal.close()
