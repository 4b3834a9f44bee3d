"""The trainer's reports shipped to the control plane through the journal: its
checkpoints (each checked against this cloud's notice), their verdicts, its output
and its step metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING

from respawn import protocol
from respawn.agent import notice_handling
from respawn.agent.channel import write_json_atomic
from respawn.notices.base import notice_budget_s, utcnow

if TYPE_CHECKING:
    from respawn.agent.lifecycle import Agent

NOTICE_COMMIT_KINDS = (protocol.CheckpointKind.NOTICE, protocol.CheckpointKind.FINAL)


def collect_checkpoints(agent: Agent) -> None:
    for report in agent.checkpoints.new_reports():
        report.notice_window_s = agent.config.notice_window_s or agent.watcher.window_s
        check_save_fits_the_notice(agent, report)
        # Every step up to the save first: a notice save's report ends the VM at once when
        # a spare takes over, and an ended VM's metrics are refused (the curve lost them).
        ship_metrics(agent)
        agent.reporter.report(protocol.PATH_CHECKPOINTS, report)
        agent.state.last_checkpoint = report
        agent.state.commit_journaled_at = utcnow()
        agent.state.checkpoint_requested = False
        if agent.state.notice is not None and agent.state.notice_commit is None and report.kind in NOTICE_COMMIT_KINDS:
            notice_handling.on_notice_commit(agent, report)
        elif agent.state.validator is not None and report.kind != protocol.CheckpointKind.FINAL:
            # The trainer validates its final checkpoint itself, before exporting it.
            agent.state.validator.submit(report)
    for checkpoint_id, verdict in agent.validations.new_reports():  # on resume, before export
        report_validation(agent, checkpoint_id, verdict)
    if agent.state.validator is not None:
        agent.state.validator.poll()


def check_save_fits_the_notice(agent: Agent, report: protocol.CheckpointReport) -> None:
    """Say in the job's output, before any notice comes, when a periodic save (its
    time less the pacing) would not fit the budget this cloud's notice leaves; and
    when it fits again. The control plane shows it on the job page too."""
    window = report.notice_window_s
    if window is None or report.persist_s is None or report.kind != protocol.CheckpointKind.PERIODIC:
        return
    budget = notice_budget_s(window)
    too_slow = report.persist_s > budget
    if too_slow == agent.state.save_too_slow:
        return
    agent.state.save_too_slow = too_slow
    if too_slow:
        agent.agent_line(f"warning: the save of step {report.step} took {report.persist_s:.0f} s to persist; "
                         f"{agent.config.provider} gives {window:.0f} s of notice ({budget:.0f} s to save): "
                         "a notice save would not commit in time (a smaller state or faster storage would)")
    else:
        agent.agent_line(f"the save of step {report.step} took {report.persist_s:.0f} s: it fits {agent.config.provider}'s notice again")


def report_validation(agent: Agent, checkpoint_id: str, report: protocol.ValidationReport) -> None:
    agent.reporter.report(protocol.PATH_VALIDATION.format(checkpoint_id=checkpoint_id), report)


def ship_logs(agent: Agent, final: bool = False) -> None:
    assert agent.state.logs is not None
    while batches := agent.state.logs.batches(final=final):
        for batch in batches:
            agent.reporter.report(protocol.PATH_LOGS, batch)
        # After the journal has them: a restarted agent ships from here, with the offsets going on.
        write_json_atomic(agent.log_position_path, agent.state.logs.position())
        if not final:
            return


def ship_metrics(agent: Agent) -> None:
    if batch := agent.metrics.batch():
        agent.reporter.report(protocol.PATH_METRICS, batch)
