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

This module is the run loop (`Agent.run`, `supervise`, `watch`); each concern is a
module of its own that takes the agent, whose mutable state is one object
(`state.AgentState`): `registration` (register, or resume a session), `setup_steps`
(source, validator, prepare step, container image), `gang` (rendezvous, promotion,
regroup), `memory_tier` (the node's buddy store), `notice_handling`,
`heartbeat_answers`, `dispatch` (an event to one of those two), `shipping` (checkpoints, verdicts, output, metrics), `tracker_run` (the MLflow
run) and `ending` (the exit report, the shut-down).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time

from respawn import protocol, trackers
from respawn.agent import (
    EXIT_INSTANCE_ENDED,
    container,
    dispatch,
    ending,
    gang,
    heartbeat_answers,
    memory_tier,
    notice_handling,
    registration,
    session,
    setup_steps,
    shipping,
    source,
    tracker_run,
)
from respawn.agent.channel import (
    ChannelPaths,
    CheckpointsTail,
    LogTail,
    MetricsTail,
    StatusReader,
    ValidationsTail,
    output_tail,
    write_json_atomic,
)
from respawn.agent.client import ControlPlaneClient
from respawn.agent.config import AgentConfig
from respawn.agent.joblog import JobLog
from respawn.agent.jobspec import check_job_spec
from respawn.agent.registration import AgentError, InstanceEnded
from respawn.agent.reporter import Backoff, Reporter
from respawn.agent.state import AgentState
from respawn.agent.supervisor import TrainerProcess, gang_env, trainer_env
from respawn.journal import Journal
from respawn.notices import NoticeEvent, make_watcher, sigterm

log = logging.getLogger(__name__)

TRAINER_LOG = "trainer.log"
LOG_POSITION = "log-position.json"  # under the work dir: how much of trainer.log was journaled, for a restart


class Agent:
    """The run loop, with what the concern modules take: collaborators set once (config,
    paths, client, journal, reporter, watcher, the trainer's channel) and `state`."""

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
        self.reporter = Reporter(self.journal, self.client, on_answer=self._on_answer, backoff=self.backoff())
        self.watcher = make_watcher(config.provider, config.metadata_url, config.notice_poll_s)
        self.status = StatusReader(self.paths.status)
        self.checkpoints = CheckpointsTail(self.paths.checkpoints)
        self.validations = ValidationsTail(self.paths.validations)
        self.metrics = MetricsTail(self.paths.metrics)
        self.events: queue.Queue = queue.Queue()
        self.stop_watching = threading.Event()
        self.state = AgentState()

    def backoff(self) -> Backoff:
        return Backoff(base_s=self.config.backoff_base_s, max_s=self.config.backoff_max_s)

    def clear_channel(self) -> None:
        """Channel files of an earlier run on this work dir must not be read again."""
        for path in (self.paths.status, self.paths.checkpoints, self.paths.validations, self.paths.control, self.paths.notice,
                     self.paths.metrics):
            if os.path.exists(path):
                os.remove(path)

    def _start_fresh(self) -> None:
        """Nor must its output be reported again."""
        self.clear_channel()
        if os.path.exists(self.log_path):
            os.replace(self.log_path, self.log_path + ".previous")
        if os.path.exists(self.log_position_path):
            os.remove(self.log_position_path)
        self.state.logs = LogTail(self.log_path)

    def run(self) -> int:
        with self.job_log:
            return self._run()

    def _run(self) -> int:
        sigterm.install(self._emit)
        try:
            self.state.session = session.load(self.session_path, check_job_spec)
            if self.state.session is None:
                self._start_fresh()
                registration.begin(self)
            elif self.state.session.ended:
                return registration.deliver_ended(self)
            else:
                registration.resume(self)
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
            self.state.session.ended = True
            registration.save_session(self)
        finally:
            ending.shut_down(self)
        return 0

    def supervise(self) -> protocol.ExitReport:
        job = self.state.job
        assert job is not None
        if self.state.stopped_by_control_plane:  # a resumed session's first heartbeat was answered `stop`
            return ending.exit_report(self, None)
        try:
            env = trainer_env(job, self.paths.env())
        except ValueError as exc:
            return ending.setup_failure(self, f"could not start the trainer {job.command!r}: {exc}", str(exc))
        if source.wanted(job):
            ended = setup_steps.put_source_in_place(self)
            if ended is not None:
                return ended
        setup_steps.start_validator(self, env)
        if job.prepare_command:
            ended = setup_steps.run_prepare(self, env)
            if ended is not None:
                return ended
        if job.world_size > 1 and job.rank > 0 and not job.rendezvous_addr:
            ended = gang.await_rendezvous(self)
            if ended is not None:
                return ended
            try:
                env.update(gang_env(job))
            except ValueError as exc:
                return ending.setup_failure(self, f"could not start the trainer {job.command!r}: {exc}", str(exc))
        if job.standby:
            ended = gang.await_promotion(self)
            if ended is not None:
                return ended
            if job.resume_from:
                env[protocol.ENV_RESUME_FROM] = job.resume_from
        setup_steps.validate_resume_checkpoint(self)
        if trackers.wants_mlflow_run(env, {**job.env, **job.secret_env}):
            tracker_run.find_mlflow_run(self, env)
        while True:
            if self.state.regroup_wanted or self.state.trainer_exit_code is not None:
                ended = gang.join_the_regrouped_gang(self)
                if ended is not None:
                    return ended
                env.pop(protocol.ENV_RESUME_FROM, None)
                if job.resume_from:
                    env[protocol.ENV_RESUME_FROM] = job.resume_from
            try:
                env.update(gang_env(job))
                memory_tier.put_in_env(self, env)
                if self.state.checkpoint_interval_s:
                    write_json_atomic(self.paths.control, {"checkpoint_interval_s": self.state.checkpoint_interval_s})
                if job.container_image:
                    self.state.trainer, ended = setup_steps.container_trainer(self, env)
                    if ended is not None:
                        return ended
                else:
                    self.state.trainer = TrainerProcess(job.command, env=env, cwd=job.working_dir, log_path=self.log_path)
                setup_steps.say_where_it_resumes(self)
                self.state.trainer.start()
            except (OSError, ValueError) as exc:
                return ending.setup_failure(self, f"could not start the trainer {job.command!r}: {exc}", str(exc))
            code = self.watch()
            shipping.collect_checkpoints(self)
            shipping.ship_metrics(self)
            if not job.elastic or self.state.notice is not None or self.state.stopped_by_control_plane or (code == 0 and not self.state.regroup_wanted):
                break
            if not self.state.regroup_wanted:
                # A peer gone breaks the gang's collectives, and so does a bug: the control plane
                # tells which (respawn_server.jobs.fleet.reconciler.check_elastic_gang).
                self.state.trainer_exit_code = code
                self.agent_line(f"the trainer exited (code {code}); as a node of an elastic gang, waiting for the "
                                "control plane's word: a peer lost (the gang goes on without it) or the code failed "
                                "(the gang stops)")
        memory_tier.hand_over_this_nodes_shards(self)  # first: the VM may be going
        if self.state.notice is not None:
            notice_handling.report_outcome(self)
        elif job.container_image and not self.state.stopped_by_control_plane:
            tail = output_tail(self.log_path)
            failure = container.runtime_failure(code, tail)
            if failure:
                shipping.ship_logs(self, final=True)
                return ending.setup_failure(self, tail, f"container image {job.container_image}: {failure} (exit {code})")
        return ending.exit_report(self, code)

    def watch(self) -> int:
        """Supervise `self.state.trainer` (the prepare step, then the trainer) until it exits:
        ship its checkpoints, output and heartbeats, act on answers and notices."""
        assert self.state.trainer is not None
        now = time.monotonic()
        next_heartbeat, next_logs = now, now + self.config.log_batch_interval_s
        while True:
            shipping.collect_checkpoints(self)
            code = self.state.trainer.poll()
            if code is not None:
                self.state.trainer.kill()  # what it left behind: loader workers, ranks in sessions of their own
                return code
            now = time.monotonic()
            if self.state.kill_at is not None and now >= self.state.kill_at:
                self.agent_line(self.state.kill_why)
                self.state.trainer.kill()
                continue
            if self.state.hold_until is not None and now >= self.state.hold_until:
                notice_handling.stop_for_notice(self, report=False)
            if now >= next_logs:
                shipping.ship_logs(self)
                next_logs = now + self.config.log_batch_interval_s
            if now >= next_heartbeat:
                self.reporter.report(protocol.PATH_HEARTBEAT, heartbeat_answers.heartbeat(self))
                shipping.ship_metrics(self)
                # While a notice is held, the control plane's word that the spare is ready must come soon.
                next_heartbeat = now + (min(gang.STANDBY_POLL_S, self.state.heartbeat_interval_s) if self.state.hold_until is not None else self.state.heartbeat_interval_s)
            try:
                event = self.events.get(timeout=self.config.tick_s)
            except queue.Empty:
                continue
            dispatch.handle(self, event)

    def _emit(self, notice: NoticeEvent) -> None:
        self.events.put(("notice", notice))

    def _on_answer(self, path: str, answer: dict | None, sent: dict) -> None:
        if path == protocol.PATH_HEARTBEAT and answer is not None:
            self.events.put(("answer", answer, sent.get("sent_at", "")))

    def agent_line(self, message: str) -> None:
        """A line in the job's output (shipped with it), so users see what the agent did and why."""
        self.job_log.say(log, message)
