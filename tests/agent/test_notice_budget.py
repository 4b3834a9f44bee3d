"""A notice's save budget is its own cloud's window less a margin, read from the notice
the watcher parsed off that cloud's emulator: AWS's two minutes are not cut to 25 s;
only a notice without a deadline (SIGTERM) gets the default."""

from __future__ import annotations

import queue
import threading
from datetime import timedelta

import pytest

from respawn.metadata_server import MetadataServer
from respawn.notices import AwsWatcher, AzureWatcher, GcpWatcher
from respawn.notices.base import NoticeEvent, PREEMPT, utcnow

POLL = 0.05
DEFAULT_S = 25.0


def notice_from(flavour: str, watcher_class, deadline_in_s: float) -> tuple[NoticeEvent, float]:
    """The notice the watcher parsed, and the deadline (epoch seconds) the emulator set."""
    server = MetadataServer(flavour).start()
    events: queue.Queue = queue.Queue()
    stop = threading.Event()
    try:
        watcher_class(server.url, poll_interval_s=POLL).start(events.put, stop)
        state = server.schedule_notice(in_s=0, deadline_in_s=deadline_in_s)
        return events.get(timeout=10), state["deadline"]
    finally:
        stop.set()
        server.stop()


# The margin, written out here: a tenth of the window, at least 5 s, at most half.
@pytest.mark.parametrize(("flavour", "watcher_class", "window_s", "margin_s"), [
    ("aws", AwsWatcher, 120, 12),
    ("gcp", GcpWatcher, 30, 5),
    ("azure", AzureWatcher, 30, 5),
    ("azure", AzureWatcher, 300, 30),
])
def test_the_budget_is_the_clouds_own_deadline_less_the_margin(flavour, watcher_class, window_s, margin_s):
    event, deadline = notice_from(flavour, watcher_class, window_s)
    # What is left of the window when the watcher saw the notice (a poll after the
    # emulator showed it), less the margin; and 10 s later, 10 s less.
    left = deadline - event.notice_time.timestamp()
    assert event.budget_s(DEFAULT_S, now=event.notice_time) == pytest.approx(left - margin_s, abs=1.0)  # the clouds state whole seconds
    later = event.notice_time + timedelta(seconds=10)
    assert event.budget_s(DEFAULT_S, now=later) == pytest.approx(left - margin_s - 10, abs=1.0)


def test_gcp_states_its_30_s_window_itself():
    event, _ = notice_from("gcp", GcpWatcher, 30)
    assert event.deadline - event.notice_time == timedelta(seconds=30)
    assert event.budget_s(DEFAULT_S, now=event.notice_time) == 25
    assert GcpWatcher.window_s == 30 and AwsWatcher.window_s == 120


def test_a_notice_without_a_deadline_gets_the_default_budget_from_its_arrival():
    now = utcnow()
    event = NoticeEvent(source="sigterm", kind=PREEMPT, notice_time=now, deadline=None, raw="SIGTERM")
    assert event.budget_s(DEFAULT_S, now=now) == DEFAULT_S
    assert event.budget_s(DEFAULT_S, now=now + timedelta(seconds=30)) == 0.0


@pytest.mark.parametrize(("window_s", "budget_s"), [(3, 1.5), (8, 4), (20, 15), (60, 54)])
def test_a_short_window_keeps_half_of_itself(window_s, budget_s):
    now = utcnow()
    event = NoticeEvent(source="local", kind=PREEMPT, notice_time=now, deadline=now + timedelta(seconds=window_s), raw="")
    assert event.budget_s(DEFAULT_S, now=now) == pytest.approx(budget_s)
