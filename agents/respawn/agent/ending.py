"""How the agent's run ends: the exit report (how the trainer ended, or why it never
started) and the shut-down that drains the journal."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from respawn import protocol
from respawn.agent import shipping
from respawn.agent.channel import int_or_none, last_exception_line, output_tail

if TYPE_CHECKING:
    from respawn.agent.lifecycle import Agent

log = logging.getLogger(__name__)

MAX_EXCEPTION_CHARS = 500  # what the control plane stores


def exit_report(agent: Agent, code: int | None) -> protocol.ExitReport:
    """How the trainer ended (`code` None: it never started, a notice or a stop came first)."""
    status = agent.status.read()
    if agent.state.notice is not None:
        reason = protocol.ExitReason.PREEMPTED
    elif agent.state.trainer_exit_code is not None:  # an elastic gang's trainer failed before the control plane's word
        reason = protocol.ExitReason.FAILED
    elif agent.state.stopped_by_control_plane or status.get("stopped") is True:
        # The second case: a gang's rank stopped with the rank that was asked to stop, its
        # save done, whatever its exit code: gloo's teardown, a peer gone first, aborts a
        # process now and then (exit -6) after training is over and nothing is lost.
        reason = protocol.ExitReason.STOPPED
    elif code != 0 and final_commit(agent) is not None:
        # A launcher's exit code (torchrun's, after a rank's teardown went wrong) says less
        # than what the ranks committed: the final checkpoint is the end of training.
        reason = protocol.ExitReason.COMPLETED
        agent.agent_line(f"the trainer's command exited {code} after its final checkpoint (step "
                         f"{final_commit(agent).step}) committed: training is complete, nothing was lost")
    else:
        reason = protocol.ExitReason.COMPLETED if code == 0 else protocol.ExitReason.FAILED
    shipping.ship_logs(agent, final=True)
    tail = output_tail(agent.log_path)
    return protocol.ExitReport(
        reason=reason,
        exit_code=code,
        final_step=int_or_none(status.get("step")),
        output_tail=tail,
        last_exception=last_exception_line(tail)[:MAX_EXCEPTION_CHARS] if reason == protocol.ExitReason.FAILED else "",
        artifact_uri=str(status.get("artifact_uri") or ""),
        artifact_digest=str(status.get("artifact_digest") or ""),
    )


def final_commit(agent: Agent) -> protocol.CheckpointReport | None:
    last = agent.state.last_checkpoint
    return last if last is not None and last.kind == protocol.CheckpointKind.FINAL else None


def setup_failed(agent: Agent, message: str) -> protocol.ExitReport:
    agent.agent_line(message)
    shipping.ship_logs(agent, final=True)
    return setup_failure(agent, output_tail(agent.log_path), message)


def setup_failure(agent: Agent, tail: str, exception: str) -> protocol.ExitReport:
    return protocol.ExitReport(reason=protocol.ExitReason.SETUP, output_tail=tail, last_exception=exception[:MAX_EXCEPTION_CHARS])


def shut_down(agent: Agent) -> None:
    agent.stop_watching.set()
    if agent.state.validator is not None:
        agent.state.validator.stop()
    if agent.state.trainer is not None and agent.state.trainer.poll() is None:
        agent.state.trainer.kill()
    if agent.state.buddy_store is not None:
        agent.state.buddy_store.close()
    if not agent.reporter.drain(agent.config.drain_timeout_s):
        log.warning("%d report(s) not delivered yet; they stay in %s", agent.journal.pending_count(), agent.journal.directory)
    agent.reporter.stop()
    agent.journal.close()
