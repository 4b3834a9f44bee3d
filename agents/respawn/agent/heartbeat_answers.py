"""The heartbeat the agent sends and what it does with the control plane's answer:
new intervals, a checkpoint asked for, a stop, a spare ready or launching, a gang that regroups."""

from __future__ import annotations

import logging
import os
import time
from datetime import datetime
from typing import TYPE_CHECKING

from respawn import protocol
from respawn.agent import notice_handling
from respawn.agent.channel import finite_or_none, write_json_atomic

if TYPE_CHECKING:
    from respawn.agent.lifecycle import Agent

log = logging.getLogger(__name__)


def on_answer(agent: Agent, answer: dict, heartbeat_sent_at: str) -> None:
    action = answer.get("action", protocol.Action.CONTINUE)
    if action not in protocol.Action.ALL:
        log.warning("heartbeat answer with an unknown action, ignored: %r", answer)
        action = protocol.Action.CONTINUE
    interval = finite_or_none(answer.get("checkpoint_interval_s"))
    if interval is not None and interval > 0 and interval != agent.state.checkpoint_interval_s:
        agent.state.checkpoint_interval_s = interval
        write_json_atomic(agent.paths.control, {"checkpoint_interval_s": interval})
    elif answer.get("checkpoint_interval_s") is not None and interval is None:
        log.warning("heartbeat answer with an unusable checkpoint_interval_s, ignored: %r", answer)
    heartbeat = finite_or_none(answer.get("heartbeat_interval_s"))
    if heartbeat is not None and heartbeat > 0:
        agent.state.heartbeat_interval_s = heartbeat
    # Generations only grow: the answer to a heartbeat sent before a regroup may still name the older one.
    generation = answer.get("gang_generation")
    if agent.state.job is not None and agent.state.job.elastic and isinstance(generation, int) and \
            generation > agent.state.job.gang_generation and not agent.state.regroup_wanted:
        agent.state.regroup_wanted = True
        if agent.state.trainer is not None and not agent.state.preparing and agent.state.trainer.poll() is None:
            # Its gang lost a node (its collectives are broken or soon will be) or regroups:
            # nothing can be saved together, so the trainer goes now and restarts in the new gang.
            agent.agent_line(f"the gang regroups (generation {generation}): stopping the trainer to restart it there")
            agent.state.trainer.kill()
    if agent.state.hold_until is not None and action in (protocol.Action.CHECKPOINT_AND_STOP, protocol.Action.STOP):
        agent.state.handover = handover_in(answer)
        where = f" (the notice save goes to its store at {agent.state.handover['address']} too)" if agent.state.handover else ""
        agent.agent_line(f"the spare is ready: checkpointing and stopping{where}")
        notice_handling.stop_for_notice(agent, report=False)
    elif agent.state.hold_until is not None and action == protocol.Action.HOLD and agent.state.hold_until != agent.state.hold_limit:
        agent.state.hold_until = agent.state.hold_limit
        agent.agent_line("a spare is launching: training on until it is ready")
    elif action == protocol.Action.CHECKPOINT and checkpoint_wanted(agent, heartbeat_sent_at) \
            and os.path.exists(agent.paths.status):
        # Only a trainer that has reported (its status file) has the library's SIGUSR1 handler:
        # one still importing would die of it. The answer is repeated until a commit.
        agent.state.checkpoint_requested = True
        notice_handling.signal_trainer(agent, protocol.SIGNAL_CHECKPOINT_NOW)
    elif action in (protocol.Action.CHECKPOINT_AND_STOP, protocol.Action.STOP) and not (agent.state.stopped_by_control_plane or agent.state.notice):
        agent.state.stopped_by_control_plane = True
        # A gang handed over whole to its spares: this node's spare's store, which its agent
        # gives this node's notice shards on its way out (agent/memory_tier.py).
        agent.state.handover = handover_in(answer)
        grace = notice_handling.budget_s(agent) if action == protocol.Action.CHECKPOINT_AND_STOP else agent.config.stop_grace_s
        notice_handling.signal_trainer(agent, agent.config.stop_signal)
        agent.state.kill_at = time.monotonic() + grace
        agent.state.kill_why = f"the trainer did not stop within {grace:.1f}s of the control plane's {action}; killing it"
        agent.agent_line(f"control plane asked to {action}; stopping the trainer within {grace:.1f}s")


def heartbeat(agent: Agent) -> protocol.Heartbeat:
    beat = agent.status.heartbeat(agent.state.last_checkpoint)
    if agent.state.trainer_exit_code is not None:
        beat.trainer_exit_code = agent.state.trainer_exit_code
    if beat.trainer_exit_code is not None or beat.memory_resume_step is not None:
        beat.gang_generation = agent.state.job.gang_generation  # what either is said about
    return beat


def checkpoint_wanted(agent: Agent, heartbeat_sent_at: str) -> bool:
    """A `checkpoint` answer is repeated until the control plane sees a commit:
    act on it once, not again for heartbeats sent before the commit it asked for."""
    if agent.state.checkpoint_requested:
        return False
    if agent.state.commit_journaled_at is not None and heartbeat_sent_at:
        # Heartbeats made after the commit was journaled reach the control plane after it.
        return datetime.fromisoformat(heartbeat_sent_at) > agent.state.commit_journaled_at
    return True


def handover_in(answer: dict) -> dict | None:
    """The spare's store an answer names for the notice save (HeartbeatAnswer.handover), if usable."""
    given = answer.get("handover")
    if given is None:
        return None
    try:
        host, _, port = given["address"].rpartition(":")
        if host and port.isdigit() and isinstance(given["token"], str) and given["token"] and type(given["node"]) is int:
            return {"address": given["address"], "token": given["token"], "node": given["node"]}
    except (TypeError, KeyError, AttributeError):
        pass
    log.warning("heartbeat answer with an unusable handover, ignored: %r", given)
    return None
