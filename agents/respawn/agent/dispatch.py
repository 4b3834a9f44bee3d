"""What the agent's loops do with an event from its queue: a notice, or a heartbeat's answer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from respawn.agent import heartbeat_answers, notice_handling

if TYPE_CHECKING:
    from respawn.agent.lifecycle import Agent


def handle(agent: Agent, event: tuple) -> None:
    if event[0] == "notice":
        notice_handling.on_notice(agent, event[1])
    elif event[0] == "answer":
        heartbeat_answers.on_answer(agent, event[1], event[2])
