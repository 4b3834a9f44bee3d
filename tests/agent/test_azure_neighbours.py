"""Azure lists the Scheduled Events of every VM in an availability set or a scale
set's placement group on each of them: the watcher acts on, and acknowledges, only
the events whose Resources name its own VM."""

from __future__ import annotations

import json
import queue
import threading
from datetime import datetime, timezone

import pytest
import requests

from respawn.metadata_server import MetadataServer
from respawn.notices import PREEMPT, AzureWatcher
from respawn.notices.azure import parse_preempt_events

POLL = 0.05
NOW = datetime(2026, 11, 29, 22, 0, tzinfo=timezone.utc)


@pytest.fixture
def imds():
    server = MetadataServer("azure", name="respawn-7").start()
    yield server
    server.stop()


def polls_seen(imds, more: int) -> None:
    target = imds.snapshot()["notice_reads"] + more
    while imds.snapshot()["notice_reads"] < target:
        threading.Event().wait(POLL)


def test_a_neighbours_preemption_is_neither_a_notice_nor_acknowledged(imds):
    events: queue.Queue = queue.Queue()
    stop = threading.Event()
    AzureWatcher(imds.url, poll_interval_s=POLL).start(events.put, stop)
    try:
        imds.schedule_notice(deadline_in_s=30, vm="respawn-8")
        polls_seen(imds, 5)
        assert events.empty()  # the set's other VM is going; this one is not
        state = imds.schedule_notice(deadline_in_s=30)
        event = events.get(timeout=10)
        event.acknowledge()
        polls_seen(imds, 3)
    finally:
        stop.set()
    assert event.kind == PREEMPT and '"respawn-8"' in event.raw  # the same document carries both
    assert events.empty()
    snapshot = imds.snapshot()
    assert snapshot["acknowledged"] == [state["event_id"]]  # the neighbour's eviction was not started early


def test_an_event_naming_several_vms_is_ours_when_one_of_them_is(caplog):
    def event(event_id, resources):
        return {"EventId": event_id, "EventType": "Preempt", "NotBefore": "Sun, 29 Nov 2026 22:00:30 GMT",
                **({"Resources": resources} if resources is not None else {})}

    doc = json.dumps({"DocumentIncarnation": 4, "Events": [
        event("A-1", ["respawn-6", "RESPAWN-7"]),  # Azure's VM names are case-insensitive
        event("A-2", ["respawn-8"]),
        event("A-3", None),
    ]})
    assert [event_id for event_id, _ in parse_preempt_events(doc, NOW, "respawn-7")] == ["A-1"]
    assert "without a Resources list" in caplog.text


def test_only_azure_lists_another_vms_events():
    server = MetadataServer("aws").start()
    try:
        answer = requests.post(server.url + "/_respawn/notice", json={"vm": "i-0other"}, timeout=2)
    finally:
        server.stop()
    assert answer.status_code == 400 and "only Azure" in answer.json()["error"]
