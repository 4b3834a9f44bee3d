"""Preemption notices and rebalance recommendations: the hold while a spare boots,
the stop signal and its budget, the notice checkpoint's commit and what the log says of it."""

from __future__ import annotations

import logging
import signal
import time
from datetime import timedelta
from typing import TYPE_CHECKING

import requests

from respawn import protocol
from respawn.agent.channel import int_or_none, write_json_atomic
from respawn.notices import REBALANCE, NoticeEvent
from respawn.notices.base import utcnow

if TYPE_CHECKING:
    from respawn.agent.lifecycle import Agent

log = logging.getLogger(__name__)

# How long a VM holding a notice trains on without the control plane's `hold` (a spare is launching).
HOLD_CONFIRM_S = 10.0
# Once its notice save has committed, what the trainer still does (its teardown: loader workers
# joined, process groups destroyed) is worth nothing to the job and can take seconds of the window.
EXIT_AFTER_NOTICE_COMMIT_S = 1.5


def budget_s(agent: Agent) -> float:
    assert agent.state.job is not None
    return agent.config.notice_budget_s or agent.state.job.notice_budget_s


def on_notice(agent: Agent, notice: NoticeEvent) -> None:
    if notice.kind == REBALANCE:
        on_rebalance(agent, notice)
        return
    if agent.state.notice is not None:
        log.info("another notice (%s) while handling one from %s; already stopping", notice.source, agent.state.notice.source)
        return
    agent.state.notice = notice
    stated = notice.deadline or notice.notice_time + timedelta(seconds=budget_s(agent))
    hold_s = notice.budget_s(budget_s(agent)) - budget_s(agent)
    if agent.state.job is not None and agent.state.job.notice_hold and hold_s > 0 and agent.state.trainer is not None and not agent.state.preparing:
        # A spare may boot meanwhile (docs/spares.md): train on until the control plane says
        # it is ready (checkpoint_and_stop), at the latest when only the save's budget is left,
        # and only briefly unless it says one is launching (`hold`).
        agent.state.hold_limit = time.monotonic() + hold_s
        agent.state.hold_until = min(agent.state.hold_limit, time.monotonic() + HOLD_CONFIRM_S)
        agent.reporter.report(
            protocol.PATH_NOTICE,
            protocol.Notice(source=notice.source, notice_time=notice.notice_time.isoformat(), deadline=stated.isoformat(), raw=notice.raw),
        )
        agent.agent_line(f"preemption notice from {notice.source}, deadline {stated.isoformat()}: training on while a spare boots, checkpointing and stopping within {hold_s:.1f}s")
        return
    stop_for_notice(agent, report=True)


def on_rebalance(agent: Agent, notice: NoticeEvent) -> None:
    """Said in the job's output. Most rebalance recommendations are not followed by a
    preemption, so training goes on; a job with spare_on_rebalance has the control plane
    told (the first time), which launches a spare and, once it is ready, asks this VM to
    checkpoint and stop: a planned move (docs/spares.md)."""
    agent.agent_line(f"rebalance recommendation from {notice.source}: {notice.raw}")
    if agent.config.checkpoint_on_rebalance:
        signal_trainer(agent, protocol.SIGNAL_CHECKPOINT_NOW)
    if agent.state.job is not None and agent.state.job.spare_on_rebalance and not agent.state.rebalance_reported and agent.state.notice is None:
        agent.state.rebalance_reported = True
        agent.reporter.report(protocol.PATH_NOTICE, protocol.Notice(
            source=notice.source, notice_time=notice.notice_time.isoformat(), raw=notice.raw,
            kind=protocol.NoticeKind.REBALANCE))
        agent.agent_line("training on while a spare boots to move the job to, on the rebalance recommendation")


def stop_for_notice(agent: Agent, report: bool) -> None:
    """Checkpoint and stop within what is left of the notice's budget (`report`: tell
    the control plane of the notice too, unless done when the hold began)."""
    notice = agent.state.notice
    assert notice is not None
    agent.state.hold_until = None
    budget = notice.budget_s(budget_s(agent))
    working_deadline = utcnow() + timedelta(seconds=budget)
    stated = notice.deadline or notice.notice_time + timedelta(seconds=budget_s(agent))
    # The trainer first: the journal's fsync can take a while when a
    # checkpoint is being written to the same disk, the report can wait for it.
    written = {"source": notice.source, "notice_time": notice.notice_time.isoformat(), "deadline": working_deadline.isoformat(),
               "cloud_deadline": notice.deadline.isoformat() if notice.deadline else None}
    if agent.state.handover is not None:  # a spare's store: the save goes there too (docs/memory-tier.md)
        written["handover"] = agent.state.handover
    write_json_atomic(agent.paths.notice, written)
    signal_trainer(agent, agent.config.stop_signal)
    agent.state.kill_at = time.monotonic() + budget
    agent.state.kill_why = f"the trainer did not stop within the notice's {budget:.1f}s; killing it"
    if report:
        agent.reporter.report(
            protocol.PATH_NOTICE,
            protocol.Notice(source=notice.source, notice_time=notice.notice_time.isoformat(), deadline=stated.isoformat(), raw=notice.raw),
        )
    if agent.state.validator is not None:
        agent.state.validator.stop()  # the CPU is the notice save's now
        agent.state.validator = None
    agent.agent_line(f"preemption notice from {notice.source}, deadline {stated.isoformat()}: checkpointing and stopping within {budget:.1f}s")


def on_notice_commit(agent: Agent, report: protocol.CheckpointReport) -> None:
    agent.state.notice_commit = report
    if report.kind == protocol.CheckpointKind.NOTICE and \
            (agent.state.kill_at is None or agent.state.kill_at > time.monotonic() + EXIT_AFTER_NOTICE_COMMIT_S):
        # Not a final one: its validation and export follow.
        agent.state.kill_at = time.monotonic() + EXIT_AFTER_NOTICE_COMMIT_S
        agent.state.kill_why = f"the trainer did not exit within {EXIT_AFTER_NOTICE_COMMIT_S:g}s of its notice commit; ending it"
    if agent.state.notice is not None and agent.state.notice.acknowledge is not None:
        try:
            agent.state.notice.acknowledge()
        except requests.RequestException as exc:
            log.warning("could not acknowledge the %s event: %s", agent.state.notice.source, exc)


def report_outcome(agent: Agent) -> None:
    if agent.state.notice_commit is not None:
        agent.agent_line(f"notice checkpoint committed at step {agent.state.notice_commit.step}: {agent.state.notice_commit.uri}")
    elif agent.state.job is not None and agent.state.job.rank > 0:
        agent.agent_line(f"rank {agent.state.job.rank} stopped; rank 0 commits and reports the gang's notice checkpoint")
    elif int_or_none(agent.status.read().get("step")) is None:
        # A trainer still importing its libraries when the notice came (tens of seconds for
        # some) dies of the stop signal: it trained nothing, so nothing was lost.
        agent.agent_line(f"the trainer had not reported a step since it started at step {agent.status.start_step} when the "
                         "notice came: nothing to save; the job resumes from its previous checkpoint")
    elif agent.state.handover is not None or agent.state.buddy_store is not None:
        agent.agent_line("no checkpoint committed to storage within the notice budget; the job resumes from the memory "
                         "tier if the notice save landed there (the trainer says so above), else from its previous "
                         "checkpoint")
    else:
        agent.agent_line("no checkpoint committed within the notice budget; the job resumes from its previous checkpoint")


def signal_trainer(agent: Agent, name: str) -> None:
    if agent.state.preparing:
        # The prepare step has nothing to checkpoint, and SIGUSR1 would kill it; it stops on SIGTERM.
        if name == protocol.SIGNAL_CHECKPOINT_NOW:
            return
        name = "SIGTERM"
    if agent.state.trainer is not None:
        agent.state.trainer.signal(getattr(signal, name))
