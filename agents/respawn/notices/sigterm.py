"""SIGTERM to the agent is a notice on every provider (GCP's ACPI shutdown, a
local supervisor, an operator's `kill`): the deadline is unknown, so the default
budget applies. The handler only hands the event over; the agent acts on it in
its main loop."""

from __future__ import annotations

import signal

from respawn.notices.base import PREEMPT, Emit, NoticeEvent, utcnow
from respawn.protocol import NoticeSource


def install(emit: Emit, signum: int = signal.SIGTERM) -> None:
    """Turn `signum` into a notice. Call from the main thread."""

    def on_signal(received: int, frame) -> None:
        emit(NoticeEvent(source=NoticeSource.SIGTERM, kind=PREEMPT, notice_time=utcnow(), deadline=None, raw=signal.Signals(received).name))

    signal.signal(signum, on_signal)
