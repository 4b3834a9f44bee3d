"""Reports reach the control plane once each, in order, whatever it answers meanwhile."""

from __future__ import annotations

import threading

import pytest

from respawn.agent.client import ControlPlaneClient
from respawn.agent.reporter import Backoff, Reporter
from respawn.journal import Journal
from respawn.protocol import Heartbeat, LogBatch
from tests.agent.standin import StandInControlPlane
from tests.conftest import wait_until


@pytest.fixture
def plane():
    server = StandInControlPlane().start()
    yield server
    server.stop()


def make_reporter(tmp_path, url, answers=None):
    client = ControlPlaneClient(url, timeout_s=1, connect_timeout_s=0.5)
    on_answer = (lambda path, answer, body: answers.append((path, answer))) if answers is not None else (lambda *a: None)
    return Reporter(Journal(str(tmp_path / "journal")), client, on_answer=on_answer, backoff=Backoff(base_s=0.01, max_s=0.05))


def test_reports_sent_during_5xx_and_429_arrive_once_in_order(tmp_path, plane):
    reporter = make_reporter(tmp_path, plane.url)
    reporter.start()
    try:
        plane.status = 503
        for n in range(5):
            reporter.report("heartbeat", Heartbeat(step=n))
        plane.status = 429
        for n in range(5, 8):
            reporter.report("logs", LogBatch(offset=n, lines=[f"line {n}"]))
        plane.status = 200
        assert reporter.drain(10)
    finally:
        reporter.stop()
    steps = [body.get("step", body.get("offset")) for _, body in plane.accepted]
    assert steps == list(range(8))


def test_reports_survive_an_agent_restart_with_their_event_ids(tmp_path, plane):
    dead_url = "http://127.0.0.1:9"  # nothing listens there
    first = make_reporter(tmp_path, dead_url)
    first.start()
    reports = [Heartbeat(step=n) for n in range(3)]
    for r in reports:
        first.report("heartbeat", r)
    first.stop()
    first.journal.close()

    second = make_reporter(tmp_path, plane.url)
    second.start()
    try:
        assert second.drain(10)
    finally:
        second.stop()
    assert [body["event_id"] for _, body in plane.accepted] == [r.event_id for r in reports]


def test_a_4xx_is_logged_and_not_retried(tmp_path, plane, caplog):
    reporter = make_reporter(tmp_path, plane.url)
    plane.status, plane.body = 400, {"step": ["must be >= 0"]}
    reporter.report("heartbeat", Heartbeat(step=-1))
    reporter.start()
    try:
        assert reporter.drain(10)
        plane.status, plane.body = 200, None
        reporter.report("heartbeat", Heartbeat(step=1))
        assert reporter.drain(10)
    finally:
        reporter.stop()
    assert [body["step"] for _, body in plane.accepted] == [1]
    assert "must be >= 0" in caplog.text


def test_nonsense_answers_are_logged_and_delivery_goes_on(tmp_path, plane, caplog):
    answers = []
    reporter = make_reporter(tmp_path, plane.url, answers)
    plane.body = "<html>proxy error</html>"
    reporter.start()
    try:
        reporter.report("heartbeat", Heartbeat(step=1))
        assert reporter.drain(10)
    finally:
        reporter.stop()
    assert answers == [("heartbeat", None)]
    assert "proxy error" in caplog.text


def test_report_returns_while_the_control_plane_hangs(tmp_path):
    # A server that accepts connections and never answers: the caller must not wait on it.
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    reporter = make_reporter(tmp_path, "http://127.0.0.1:%d" % sock.getsockname()[1])
    reporter.start()
    done = threading.Event()
    try:
        def report_many():
            for n in range(20):
                reporter.report("heartbeat", Heartbeat(step=n))
            done.set()

        threading.Thread(target=report_many, daemon=True).start()
        assert done.wait(10)
        assert reporter.journal.pending_count() >= 19
    finally:
        reporter.stop()
        sock.close()


def test_backoff_doubles_with_jitter_up_to_its_cap_and_resets():
    backoff = Backoff(base_s=1, max_s=8)
    waits = [backoff.next_wait() for _ in range(6)]
    for wait, ceiling in zip(waits, [1, 2, 4, 8, 8, 8]):
        assert ceiling / 2 <= wait <= ceiling
    assert len(set(waits)) > 1
    backoff.reset()
    assert backoff.next_wait() <= 1


def test_a_backoff_that_cannot_work_is_refused():
    with pytest.raises(ValueError, match="0 < base_s <= max_s"):
        Backoff(base_s=5, max_s=1)


def test_a_journal_write_that_fails_does_not_stop_later_reports(tmp_path, plane, caplog):
    # The cursor's write fails (here its temporary name is taken by a directory, as a full or
    # failing disk fails it): the sender logs it and goes on; before, its thread died and the
    # agent never reported again.
    reporter = make_reporter(tmp_path, plane.url)
    in_the_way = tmp_path / "journal" / (reporter.journal._cursor_path.rsplit("/", 1)[1] + ".tmp")
    in_the_way.mkdir()
    reporter.report("heartbeat", Heartbeat(step=1))
    reporter.start()
    try:
        wait_until(lambda: "the report journal failed" in caplog.text, timeout=10, what="the journal's failure logged")
        in_the_way.rmdir()
        reporter.report("heartbeat", Heartbeat(step=2))
        assert reporter.drain(10)
    finally:
        reporter.stop()
    assert [body["step"] for _, body in plane.accepted] == [1, 2]
