"""Sends journaled reports to the control plane in order, in a thread of its own.

`report()` only appends to the journal (a local fsync), so the training loop and
the agent's main loop never wait on the network. The sender delivers the oldest
record first and moves on only once it was taken (2xx) or refused for good (a
4xx other than 429, logged with the body); otherwise it backs off with jitter
and resends the same record with the same `event_id`.
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass
from typing import Any, Callable

from respawn import protocol
from respawn.agent.client import DELIVERED, REFUSED, ControlPlaneClient
from respawn.journal import Journal

log = logging.getLogger(__name__)

# (path, decoded answer or None, the body that was sent)
OnAnswer = Callable[[str, dict[str, Any] | None, dict[str, Any]], None]


@dataclass(kw_only=True)
class Backoff:
    """Exponential back-off with jitter: each wait is drawn from [d/2, d], d doubling up to max_s."""

    base_s: float = 0.5
    max_s: float = 30.0
    _failures: int = 0

    def __post_init__(self):
        if not 0 < self.base_s <= self.max_s:
            raise ValueError(f"back-off needs 0 < base_s <= max_s, got base_s={self.base_s} max_s={self.max_s}")

    def next_wait(self) -> float:
        d = min(self.max_s, self.base_s * 2**self._failures)
        self._failures = min(self._failures + 1, 32)
        return random.uniform(d / 2, d)

    def reset(self) -> None:
        self._failures = 0


class Reporter:
    def __init__(self, journal: Journal, client: ControlPlaneClient, *, on_answer: OnAnswer, backoff: Backoff):
        self.journal = journal
        self.client = client
        self.on_answer = on_answer
        self.backoff = backoff
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reporter", daemon=True)

    def report(self, path: str, report: protocol.Report) -> None:
        self.journal.append(path, protocol.to_dict(report))

    def start(self) -> None:
        self._thread.start()

    def drain(self, timeout_s: float) -> bool:
        """Wait until everything journaled was delivered (True) or `timeout_s` passed."""
        return self.journal.wait_empty(timeout_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._send_next()
            except OSError as exc:
                # The journal's disk failed a read or its cursor's write (full, an I/O error):
                # the thread stays, and tries again; a record sent again carries its event_id,
                # which the control plane applies once.
                wait = self.backoff.next_wait()
                log.error("the report journal failed (%s); retrying in %.2fs", exc, wait)
                self._stop.wait(wait)

    def _send_next(self) -> None:
        entry = self.journal.next(timeout=0.2)
        if entry is None:
            return
        outcome = self.client.post(entry.path, entry.body)
        if outcome.kind == DELIVERED:
            self.journal.delivered(entry)
            self.backoff.reset()
            self._answer(entry, outcome.answer)
        elif outcome.kind == REFUSED:
            log.warning("control plane refused %s (HTTP %s), not resending: %s; body=%r", entry.path, outcome.status, outcome.detail, entry.body)
            self.journal.delivered(entry)
        else:
            wait = self.backoff.next_wait()
            log.info("control plane unavailable for %s (%s %s); %d report(s) journaled, retrying in %.2fs", entry.path, outcome.status or "", outcome.detail[:200], self.journal.pending_count(), wait)
            self._stop.wait(wait)

    def _answer(self, entry, answer: dict[str, Any] | None) -> None:
        try:
            self.on_answer(entry.path, answer, entry.body)
        except Exception:  # an answer handler bug must not stop delivery of later reports
            log.exception("handling the answer to %s failed; answer=%r", entry.path, answer)
