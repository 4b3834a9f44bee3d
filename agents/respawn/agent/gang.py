"""A gang's waits on the control plane: a rank > 0 waiting for rank 0's rendezvous, a
spare or joiner waiting to be promoted, an elastic node waiting for its gang to regroup."""

from __future__ import annotations

import logging
import queue
import time
from typing import TYPE_CHECKING

from respawn import protocol
from respawn.agent import dispatch, ending, heartbeat_answers, memory_tier, notice_handling, registration
from respawn.agent.client import DELIVERED, REFUSED

if TYPE_CHECKING:
    from respawn.agent.lifecycle import Agent

log = logging.getLogger(__name__)

# How often a spare asks whether it is promoted, and a VM holding a notice for a spare
# heartbeats to hear that it is ready: each hand-over waits at most this long on the ask.
STANDBY_POLL_S = 0.5


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


def await_rendezvous(agent: Agent) -> protocol.ExitReport | None:
    """A rank > 0 that registered before rank 0 has no rendezvous address yet (on a
    cloud it is known only once rank 0 registers): ask for it until it comes. It
    sets `agent.state.job.rendezvous_addr`; an exit report as `poll_until`'s, or when no
    address came within the register timeout."""
    job = agent.state.job
    assert job is not None
    agent.agent_line(f"rank {job.rank} of {job.world_size}: waiting for rank 0 to register and give its rendezvous address")

    def arrived(answer: dict) -> bool:
        addr = answer.get("rendezvous_addr")
        if not isinstance(addr, str):
            log.warning("rendezvous answer with an unusable rendezvous_addr, ignored: %r", answer)
        elif addr:
            job.rendezvous_addr = addr
            agent.agent_line(f"rank 0's rendezvous address: {addr}")
            return True
        return False

    return poll_until(agent, protocol.PATH_RENDEZVOUS, "rendezvous", arrived, agent.state.heartbeat_interval_s,
                      give_up=(agent.config.register_timeout_s, f"rank {job.rank} got no rendezvous address within {agent.config.register_timeout_s}s: rank 0 did not register"))


def await_promotion(agent: Agent) -> protocol.ExitReport | None:
    """A spare (docs/spares.md), booted and prepared during another VM's notice, or a
    joiner of an elastic gang (docs/elastic.md): ask `standby` every STANDBY_POLL_S until
    this one is promoted (that VM has ended, or the gang regrouped with it), then take the
    checkpoint, and a joiner its rank, world size and rendezvous, that the answer names.
    No limit here: the control plane releases one it will not need (the `stop` this loop
    ends on)."""
    job = agent.state.job
    assert job is not None
    memory_tier.stand_by_for_handover(agent)  # before the first poll, which says this spare is ready
    agent.agent_line("standing by: prepared; training once promoted (a spare: after the noticed VM's checkpoint; "
                     "a joiner: when its gang regroups with it at a checkpoint)")

    def promoted(answer: dict) -> bool:
        if answer.get("standby") is not False:
            return False
        _take_resume(job, answer)
        gang = _gang_in(answer) if job.elastic else None
        if gang is not None:
            job.rank, job.world_size, job.rendezvous_addr, job.gang_generation = gang
            agent.state.regroup_wanted = False  # this is the regroup its heartbeat may have announced
        job.standby = False
        agent.status.start_step = job.resume_step or 0
        return True

    return poll_until(agent, protocol.PATH_STANDBY, "standby", promoted, STANDBY_POLL_S)


def join_the_regrouped_gang(agent: Agent) -> protocol.ExitReport | None:
    """An elastic gang's node whose trainer exited, on its own or stopped for a regroup:
    ask `standby` until it names a new generation of the gang, and take this node's rank,
    world size, rendezvous and resume checkpoint from it (kept in the session, so a
    restarted agent trains there too). None when the trainer may restart; else the
    exit report: told to stop (a failed trainer's with its own code and output), a
    notice, or no word within the register timeout."""
    job = agent.state.job
    assert job is not None
    give_up_at = time.monotonic() + agent.config.register_timeout_s
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

    ended = poll_until(agent, protocol.PATH_STANDBY, "standby", regrouped, STANDBY_POLL_S)
    if gave_up:
        agent.agent_line(f"no word from the control plane within {agent.config.register_timeout_s}s; reporting the trainer's exit")
    if gave_up or ended is not None and agent.state.notice is None:
        return ending.exit_report(agent, agent.state.trainer_exit_code)
    if ended is not None:
        return ended
    agent.state.trainer_exit_code, agent.state.regroup_wanted, agent.state.checkpoint_requested = None, False, False
    agent.status.restart(job.resume_step or 0)  # the stopped trainer's step is not where the new one starts
    registration.save_session(agent)
    agent.agent_line(f"the gang regrouped (generation {job.gang_generation}): rank {job.rank} of {job.world_size}, "
                     f"rendezvous {job.rendezvous_addr or '(rank 0 not registered yet)'}; restarting the trainer")
    if job.rank > 0 and not job.rendezvous_addr:
        return await_rendezvous(agent)
    return None


def poll_until(agent: Agent, path: str, what: str, done, every_s: float,
               give_up: tuple[float, str] | None = None) -> protocol.ExitReport | None:
    """GET `path` every `every_s` until `done(answer)`, heartbeating meanwhile so this
    instance is not taken for lost. None once done; else an exit report: a notice or
    a stop came first, the control plane refused the call, or `give_up`'s seconds
    passed (a setup failure with its message)."""
    give_up_at = time.monotonic() + give_up[0] if give_up else None
    next_poll = time.monotonic()
    next_beat = next_poll
    while not (agent.state.notice or agent.state.stopped_by_control_plane):
        now = time.monotonic()
        if now >= next_poll:
            if now >= next_beat:
                agent.reporter.report(protocol.PATH_HEARTBEAT, heartbeat_answers.heartbeat(agent))
                next_beat = now + agent.state.heartbeat_interval_s
            outcome = agent.client.get(path)
            if outcome.kind == DELIVERED and isinstance(outcome.answer, dict) and done(outcome.answer):
                return None
            if outcome.kind == REFUSED:
                return ending.setup_failed(agent, f"the control plane refused the {what} call (HTTP {outcome.status}): {outcome.detail[:500]}")
            if give_up_at is not None and now >= give_up_at:
                return ending.setup_failed(agent, give_up[1])
            next_poll = time.monotonic() + every_s
        try:
            event = agent.events.get(timeout=max(0.0, min(agent.config.tick_s, next_poll - time.monotonic())))
        except queue.Empty:
            continue
        dispatch.handle(agent, event)
    if agent.state.notice is not None:
        notice_handling.report_outcome(agent)
    return ending.exit_report(agent, None)
