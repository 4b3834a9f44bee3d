"""What every notice watcher shares: the event it emits, payload checks, the poll loop.

A watcher runs in its own thread, polls one metadata source and calls `emit`
once per real notice. Garbage from the source (HTML, truncated JSON, wrong
types, implausible times) is logged with the raw payload, once for each distinct
answer, and never ends the loop, so a later real notice is still seen.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Callable

import requests

from respawn.protocol import MAX_RAW_PAYLOAD_CHARS, NoticeKind

log = logging.getLogger(__name__)

PREEMPT, REBALANCE = NoticeKind.PREEMPT, NoticeKind.REBALANCE

# A stated deadline further ahead than this is not believed (clouds give 30 s to
# 15 min); one at or before "now" cannot be met. Either way the notice itself is
# real: it is acted on with the default budget and the raw payload is logged.
MAX_PLAUSIBLE_DEADLINE = timedelta(days=1)

# A notice's save must be committed and reported, and the trainer gone, before the
# cloud's deadline: its budget stops a tenth of the cloud's window (at least 5 s, at
# most half the window) short of it. AWS's 2 minutes leave 108 s; GCP's and Azure's
# 30 s leave 25 s.
NOTICE_MARGIN_FRACTION = 0.1
MIN_NOTICE_MARGIN_S = 5.0


def notice_margin_s(window_s: float) -> float:
    return min(max(MIN_NOTICE_MARGIN_S, NOTICE_MARGIN_FRACTION * window_s), window_s / 2)


def notice_budget_s(window_s: float) -> float:
    """The save budget a notice `window_s` ahead of its deadline leaves."""
    return window_s - notice_margin_s(window_s)


class PayloadError(ValueError):
    """A metadata answer that is not what the source documents."""


@dataclass(frozen=True, kw_only=True)
class NoticeEvent:
    source: str  # a protocol.NoticeSource
    kind: str  # PREEMPT or REBALANCE
    notice_time: datetime
    deadline: datetime | None
    raw: str
    acknowledge: Callable[[], None] | None = None  # Azure: tell the platform we are done

    def budget_s(self, default_s: float, now: datetime | None = None) -> float:
        """Seconds left to save: up to the notice's own deadline less the margin
        (notice_margin_s of the window it gives), or `default_s` from the notice when
        it states none (a SIGTERM, an unusable time)."""
        now = now or utcnow()
        if self.deadline is None:
            left = default_s - (now - self.notice_time).total_seconds()
        else:
            window = (self.deadline - self.notice_time).total_seconds()
            left = (self.deadline - now).total_seconds() - notice_margin_s(window)
        return max(0.0, left)


Emit = Callable[[NoticeEvent], None]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def truncate_raw(raw: str | bytes) -> str:
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    return raw[:MAX_RAW_PAYLOAD_CHARS]


def plausible_deadline(deadline: datetime, now: datetime, raw: str, source: str) -> datetime | None:
    if deadline.tzinfo is None:
        deadline = deadline.replace(tzinfo=timezone.utc)
    if now < deadline <= now + MAX_PLAUSIBLE_DEADLINE:
        return deadline
    why = "has passed already (seen late, or the clocks differ)" if deadline <= now else "is too far ahead to believe"
    log.warning("%s: notice deadline %s %s (now %s); saving within the default budget. raw=%r", source, deadline.isoformat(),
                why, now.isoformat(), raw)
    return None


# What the watcher polling in this thread has warned of already: a source stuck on one bad
# answer is read every few seconds until the VM goes, and one warning says it all.
_this_watcher = threading.local()
MAX_REMEMBERED_GARBAGE = 64


def log_garbage(source: str, error: Exception, raw: str | bytes) -> None:
    raw = truncate_raw(raw)
    warned = getattr(_this_watcher, "warned", None)
    if warned is not None:
        if (source, str(error), raw) in warned:
            log.debug("%s: the same unreadable metadata answer again (%s)", source, error)
            return
        if len(warned) >= MAX_REMEMBERED_GARBAGE:
            warned.clear()
        warned.add((source, str(error), raw))
    log.warning("%s: ignoring an unreadable metadata answer (%s). raw=%r", source, error, raw)


class PollingWatcher(ABC):
    """Polls a metadata source every `poll_interval_s` until stopped.

    `poll()` returns the notices seen in one poll (usually none); a notice is
    emitted once per `key` it carries, so a notice still visible on the next
    poll is not reported twice. `poll()` skips reading a notice whose key is in
    `emitted` again: it stays visible until the VM goes, and reading it may warn.
    """

    source: str
    window_s: float | None = None
    """The notice this source gives before the VM goes (None: not known beforehand);
    a save slower than its budget is warned about before any notice comes."""

    def __init__(self, base_url: str, *, poll_interval_s: float, timeout_s: float = 2.0):
        if poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be > 0, got {poll_interval_s}")
        self.base_url = base_url.rstrip("/")
        self.poll_interval_s = poll_interval_s
        self.timeout_s = timeout_s
        self.session = requests.Session()
        self.emitted: set[str] = set()

    @abstractmethod
    def poll(self) -> list[tuple[str, NoticeEvent]]:
        """One look at the source: `(key, event)` for each notice visible now."""

    def run(self, emit: Emit, stop: threading.Event) -> None:
        _this_watcher.warned = set()  # each distinct unreadable answer warned of once
        while not stop.is_set():
            try:
                found = self.poll()
            except requests.RequestException as exc:
                log.info("%s: metadata service unreachable (%s); retrying", self.source, exc)
                found = []
            for key, event in found:
                if key not in self.emitted:
                    self.emitted.add(key)
                    emit(event)
            stop.wait(self.wait_after_poll())

    def wait_after_poll(self) -> float:
        return self.poll_interval_s

    def start(self, emit: Emit, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(emit, stop), name=f"watch-{self.source}", daemon=True)
        thread.start()
        return thread
