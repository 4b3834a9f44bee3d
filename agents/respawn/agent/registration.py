"""The agent's session: register (or deliver an ended session's reports, or resume one
after a restart), and keep it on disk (respawn.agent.session) so a restarted agent resumes."""

from __future__ import annotations

import json
import logging
import queue
import socket
import time
from typing import TYPE_CHECKING

import requests

from respawn import __version__, protocol
from respawn.agent import ending, heartbeat_answers, session
from respawn.agent.channel import LogTail, parse_checkpoint_line
from respawn.agent.client import DELIVERED, REFUSED, Outcome
from respawn.agent.jobspec import check_job_spec
from respawn.notices import PREEMPT

if TYPE_CHECKING:
    from respawn.agent.lifecycle import Agent

log = logging.getLogger(__name__)


class AgentError(Exception):
    """The agent cannot go on (register refused, no job spec); the message says why."""


class InstanceEnded(AgentError):
    """The control plane refused this VM's token (a resumed session's agent token, or
    the bootstrap token at register): the instance is over."""


def begin(agent: Agent) -> None:
    answer = register(agent)
    adopt(agent, answer.job, answer.agent_token)
    agent.state.session = session.Session(agent_token=answer.agent_token, job=answer.job)
    save_session(agent)


def save_session(agent: Agent) -> None:
    assert agent.state.session is not None
    try:
        session.save(agent.session_path, agent.state.session)
    except OSError as exc:  # training can go on; only a restart of this agent would suffer
        log.warning("could not write the session file %s: %s; a restarted agent could not resume", agent.session_path, exc)


def resume(agent: Agent) -> None:
    """Pick up the session of an agent that died on this VM (its trainer died with
    it): make sure the control plane still takes its token, report what the trainer
    committed that the dead agent had not, and point the trainer at the newest of
    those. InstanceEnded when the control plane refused the token."""
    stored = agent.state.session
    assert stored is not None
    adopt(agent, stored.job, stored.agent_token)
    agent.agent_line(f"resuming session of instance {stored.job.instance_id} after a restart")
    committed = committed_by_the_dead_trainer(agent)
    beat = agent.status.heartbeat(committed[-1] if committed else None)  # where the dead trainer got to
    agent.clear_channel()
    agent.state.logs = LogTail(agent.log_path, **read_log_position(agent))
    outcome = call_until_answered(agent, protocol.PATH_HEARTBEAT, protocol.to_dict(beat), "heartbeat")
    if outcome.kind == REFUSED:
        refusal = f"the control plane refused the stored agent token of instance {stored.job.instance_id} (HTTP {outcome.status}): {outcome.detail[:500]}"
        if outcome.status == 401:
            agent.agent_line(f"{refusal}; the instance ended while the agent was down: not restarting the trainer")
            raise InstanceEnded(f"{refusal} (the instance ended or was fenced while the agent was down); exiting without restarting the trainer")
        raise AgentError(refusal)
    for report in committed:  # event_ids follow from the checkpoints: applied once if already delivered
        agent.reporter.report(protocol.PATH_CHECKPOINTS, report)
    if committed:
        agent.state.last_checkpoint = newest = max(committed, key=lambda c: c.step)
        if stored.job.resume_step is None or newest.step > stored.job.resume_step:
            # The spec's resume checkpoint is older than what this instance committed since.
            stored.job.resume_from, stored.job.resume_step = newest.uri, newest.step
            stored.job.resume_validation = protocol.ValidationResult.PENDING  # the control plane has not judged it
            agent.status.start_step = newest.step
            save_session(agent)
        agent.agent_line(f"the trainer resumes from the newest checkpoint it committed: step {newest.step}, {newest.uri}")
    answer = outcome.answer or {}
    if answer.get("action") == protocol.Action.CHECKPOINT:
        answer = {**answer, "action": protocol.Action.CONTINUE}  # nothing to checkpoint yet; the answer is repeated
    heartbeat_answers.on_answer(agent, answer, "")


def committed_by_the_dead_trainer(agent: Agent) -> list[protocol.CheckpointReport]:
    reports = []
    try:
        with open(agent.paths.checkpoints, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            reports.append(parse_checkpoint_line(line))
        except (ValueError, TypeError) as exc:  # a torn last line, or a trainer's bug
            log.warning("skipping an unreadable line of %s (%s): %r", agent.paths.checkpoints, exc, line[:500])
    return reports


def read_log_position(agent: Agent) -> dict[str, int]:
    try:
        with open(agent.log_position_path) as f:
            doc = json.load(f)
        return {k: int(doc[k]) for k in ("byte_offset", "line_offset")}
    except (OSError, ValueError, KeyError, TypeError):
        return {"byte_offset": 0, "line_offset": 0}


def deliver_ended(agent: Agent) -> int:
    """The session ended before this start (a reboot, or a crash after the exit
    report was journaled): deliver what the journal holds, start no trainer."""
    assert agent.state.session is not None
    log.info("the session of instance %s ended before this start; delivering %d journaled report(s), starting no trainer",
             agent.state.session.job.instance_id, agent.journal.pending_count())
    agent.client.agent_token = agent.state.session.agent_token
    agent.reporter.start()
    ending.shut_down(agent)
    return 0


def register(agent: Agent) -> protocol.RegisterAnswer:
    body = protocol.to_dict(
        protocol.Register(bootstrap_token=agent.config.bootstrap_token, provider_instance_id=instance_id(agent), hostname=socket.gethostname(), agent_version=__version__)
    )
    outcome = call_until_answered(agent, protocol.PATH_REGISTER, body, "register")
    if outcome.kind == REFUSED:
        # A refused bootstrap token stays refused: the instance is over for this VM (exit
        # EXIT_INSTANCE_ENDED, which systemd does not restart); anything else is exit 2.
        error = InstanceEnded if outcome.status == 401 else AgentError
        raise error(f"the control plane refused to register this agent (HTTP {outcome.status}): {outcome.detail[:500]} (the bootstrap token is single-use: a VM that registered once cannot register again)")
    return parse_register(agent, outcome.answer, outcome.detail)


def call_until_answered(agent: Agent, path: str, body: dict, what: str) -> Outcome:
    """POST `body` until the control plane answers (delivered or refused) or the
    register timeout runs out (AgentError, as does a preemption meanwhile)."""
    backoff, give_up = agent.backoff(), time.monotonic() + agent.config.register_timeout_s
    while True:
        outcome = agent.client.post(path, body)
        if outcome.kind in (DELIVERED, REFUSED):
            return outcome
        if time.monotonic() >= give_up:
            raise AgentError(f"could not {what} with {agent.config.control_plane_url} within {agent.config.register_timeout_s}s: {outcome.detail[:500]}")
        wait = backoff.next_wait()
        log.info("%s: control plane unavailable (%s %s); retrying in %.2fs", what, outcome.status or "", outcome.detail[:200], wait)
        try:
            event = agent.events.get(timeout=wait)
        except queue.Empty:
            continue
        if event[0] == "notice" and event[1].kind == PREEMPT:
            raise AgentError(f"preempted ({event[1].source}) before the control plane answered {what}; nothing to save")


def parse_register(agent: Agent, answer: dict | None, raw: str) -> protocol.RegisterAnswer:
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


def instance_id(agent: Agent) -> str:
    try:
        return getattr(agent.watcher, "instance_id")()
    except (requests.RequestException, AttributeError) as exc:
        log.info("could not read the instance id from %s: %s", agent.config.metadata_url, exc)
        return ""


def adopt(agent: Agent, job: protocol.JobSpec, agent_token: str) -> None:
    agent.client.agent_token = agent_token
    agent.state.job = job
    agent.state.heartbeat_interval_s = agent.config.heartbeat_interval_s or job.heartbeat_interval_s
    agent.state.checkpoint_interval_s = job.checkpoint_interval_s
    agent.status.start_step = job.resume_step or 0
