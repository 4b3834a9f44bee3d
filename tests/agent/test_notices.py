"""Each notice watcher against the metadata emulator of its cloud."""

from __future__ import annotations

import json
import os
import queue
import signal
import threading
from datetime import timedelta

import pytest
import requests

from respawn.metadata_server import CannedAnswer, MetadataServer
from respawn.notices import PREEMPT, REBALANCE, AwsWatcher, AzureWatcher, GcpWatcher, LocalWatcher, sigterm
from respawn.protocol import NoticeSource
from respawn_server.jobs.fleet.providers.gcp import vm_id  # how GcpProvider names a VM (no SDK import)
from tests.conftest import wait_until

POLL = 0.05


@pytest.fixture
def imds(request):
    server = MetadataServer(request.param).start()
    yield server
    server.stop()


def watch(watcher):
    events: queue.Queue = queue.Queue()
    stop = threading.Event()
    thread = watcher.start(events.put, stop)
    return events, stop, thread


def next_event(events, timeout=10):
    return events.get(timeout=timeout)


@pytest.mark.parametrize("imds", ["aws"], indirect=True)
def test_imds_refuses_reads_without_a_session_token(imds):
    assert requests.get(imds.url + "/latest/meta-data/instance-id", timeout=2).status_code == 401
    assert requests.put(imds.url + "/latest/api/token", timeout=2).status_code == 400
    token = requests.put(imds.url + "/latest/api/token", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}, timeout=2).text
    r = requests.get(imds.url + "/latest/meta-data/instance-id", headers={"X-aws-ec2-metadata-token": token}, timeout=2)
    assert r.text == imds.state.instance_id
    imds.expire_tokens()
    assert requests.get(imds.url + "/latest/meta-data/instance-id", headers={"X-aws-ec2-metadata-token": token}, timeout=2).status_code == 401


@pytest.mark.parametrize("imds", ["aws"], indirect=True)
def test_aws_watcher_reports_spot_instance_action_with_its_deadline(imds):
    watcher = AwsWatcher(imds.url, poll_interval_s=POLL)
    events, stop, _ = watch(watcher)
    try:
        # A few polls see 404, then the token expires: the watcher must fetch a new one.
        while imds.snapshot()["notice_reads"] < 3:
            threading.Event().wait(POLL)
        imds.expire_tokens()
        state = imds.schedule_notice(deadline_in_s=120)
        event = next_event(events)
    finally:
        stop.set()
    assert event.source == NoticeSource.AWS_IMDS and event.kind == PREEMPT
    assert abs(event.deadline.timestamp() - state["deadline"]) < 1.0
    assert '"action": "terminate"' in event.raw
    assert events.empty()  # still visible on later polls, reported once


@pytest.mark.parametrize("imds", ["aws"], indirect=True)
def test_aws_rebalance_recommendation_is_reported_as_its_own_kind(imds):
    events, stop, _ = watch(AwsWatcher(imds.url, poll_interval_s=POLL))
    try:
        imds.schedule_notice(kind="rebalance")
        assert next_event(events).kind == REBALANCE
        imds.schedule_notice(deadline_in_s=120)
        assert next_event(events).kind == PREEMPT
    finally:
        stop.set()


@pytest.mark.parametrize("imds", ["aws"], indirect=True)
def test_local_watcher_reads_the_imds_compatible_endpoint(imds):
    events, stop, _ = watch(LocalWatcher(imds.url, poll_interval_s=POLL))
    try:
        imds.schedule_notice(deadline_in_s=30)
        assert next_event(events).source == NoticeSource.LOCAL
    finally:
        stop.set()


GARBAGE = [
    CannedAnswer(status=200, body="<html><body>Service Unavailable</body></html>", content_type="text/html"),
    CannedAnswer(status=200, body='{"action": "termin', content_type="application/json"),
    CannedAnswer(status=200, body='{"action": 7, "time": []}', content_type="application/json"),
    CannedAnswer(status=200, body="[1, 2, 3]", content_type="application/json"),
    CannedAnswer(status=500, body="boom"),
    CannedAnswer(status=0),
]


@pytest.mark.parametrize("imds", ["aws", "gcp", "azure"], indirect=True)
def test_garbage_from_the_metadata_service_never_hides_the_real_notice(imds, caplog):
    watcher = {"aws": AwsWatcher, "gcp": GcpWatcher, "azure": AzureWatcher}[imds.flavour](imds.url, poll_interval_s=POLL)
    for answer in GARBAGE:
        imds.add_canned(answer)
    caplog.set_level("WARNING")
    events, stop, thread = watch(watcher)
    try:
        while imds.state.canned:
            threading.Event().wait(POLL)
        imds.schedule_notice(deadline_in_s=60)
        event = next_event(events)
        assert thread.is_alive()  # still watching after all that
    finally:
        stop.set()
    assert event.kind == PREEMPT
    assert "Service Unavailable" in caplog.text  # the raw payload is in the log
    assert events.empty()


@pytest.mark.parametrize("imds", ["aws", "gcp", "azure"], indirect=True)
def test_the_same_garbage_answer_again_and_again_is_warned_of_once(imds, caplog):
    watcher = {"aws": AwsWatcher, "gcp": GcpWatcher, "azure": AzureWatcher}[imds.flavour](imds.url, poll_interval_s=POLL)
    imds.add_canned(CannedAnswer(status=200, body="<html>Service Unavailable</html>", times=8))
    imds.add_canned(CannedAnswer(status=200, body="<html>Bad Gateway</html>", times=8))
    caplog.set_level("WARNING")
    events, stop, _ = watch(watcher)
    try:
        wait_until(lambda: not imds.state.canned, timeout=10, what="sixteen garbage answers read")
        imds.schedule_notice(deadline_in_s=60)
        assert next_event(events).kind == PREEMPT  # still watching
    finally:
        stop.set()
    said = [r.getMessage() for r in caplog.records if "unreadable metadata answer" in r.getMessage()]
    assert [m for m in said if "Service Unavailable" in m] != [] and [m for m in said if "Bad Gateway" in m] != []
    assert len(said) == 2, said  # each answer once, not once a poll


def the_notice_while_it_stays(imds, body: str, watcher):
    """The one notice a watcher emits from `body`, answered on the notice path from then on,
    after five more polls have read it again."""
    imds.add_canned(CannedAnswer(status=200, body=body, content_type="application/json", times=1000))
    events, stop, _ = watch(watcher)
    try:
        event = next_event(events)
        reads = imds.snapshot()["notice_reads"]
        wait_until(lambda: imds.snapshot()["notice_reads"] >= reads + 5, timeout=10, what="five more polls")
    finally:
        stop.set()
    assert events.empty()
    return event


@pytest.mark.parametrize("imds", ["aws"], indirect=True)
@pytest.mark.parametrize("time_value", ["2001-01-01T00:00:00Z", "2999-01-01T00:00:00Z", "yesterday"])
def test_an_implausible_aws_deadline_still_counts_as_a_notice(imds, time_value, caplog):
    event = the_notice_while_it_stays(imds, f'{{"action": "terminate", "time": "{time_value}"}}',
                                      AwsWatcher(imds.url, poll_interval_s=POLL))
    assert event.kind == PREEMPT and event.deadline is None
    # said once, not once a poll until the VM goes
    assert len([r for r in caplog.records if time_value in r.getMessage()]) == 1


@pytest.mark.parametrize("imds", ["azure"], indirect=True)
def test_an_azure_preempt_past_its_not_before_is_a_notice_said_once(imds, caplog):
    doc = {"DocumentIncarnation": 1, "Events": [{"EventId": "A-1", "EventType": "Preempt", "ResourceType": "VirtualMachine",
                                                 "Resources": [imds.state.name], "EventStatus": "Scheduled",
                                                 "NotBefore": "Mon, 01 Jan 2001 00:00:00 GMT"}]}
    event = the_notice_while_it_stays(imds, json.dumps(doc), AzureWatcher(imds.url, poll_interval_s=POLL))
    assert event.kind == PREEMPT and event.deadline is None
    assert len([r for r in caplog.records if "has passed already" in r.getMessage()]) == 1


@pytest.mark.parametrize("imds", ["gcp"], indirect=True)
def test_gcp_metadata_requires_the_flavor_header(imds):
    assert requests.get(imds.url + "/computeMetadata/v1/instance/preempted", timeout=2).status_code == 403
    r = requests.get(imds.url + "/computeMetadata/v1/instance/preempted", headers={"Metadata-Flavor": "Google"}, timeout=2)
    assert r.text == "FALSE" and r.headers["Metadata-Flavor"] == "Google" and r.headers["ETag"]


@pytest.mark.parametrize("imds", ["gcp"], indirect=True)
def test_gcp_long_poll_sees_preemption_and_survives_reconnects(imds):
    # Long polls of 1 s that time out and a dropped connection: the watcher keeps asking.
    watcher = GcpWatcher(imds.url, poll_interval_s=POLL, wait_s=1)
    events, stop, _ = watch(watcher)
    try:
        while imds.snapshot()["notice_reads"] < 2:
            threading.Event().wait(POLL)
        imds.add_canned(CannedAnswer(status=0))
        while imds.state.canned:
            threading.Event().wait(POLL)
        imds.schedule_notice(in_s=0.2, deadline_in_s=30)
        event = next_event(events)
    finally:
        stop.set()
    assert event.source == NoticeSource.GCP_METADATA and event.raw == "TRUE"
    assert event.deadline - event.notice_time == timedelta(seconds=30)


@pytest.mark.parametrize("imds", ["azure"], indirect=True)
def test_azure_scheduled_events_need_the_metadata_header(imds):
    assert requests.get(imds.url + "/metadata/scheduledevents?api-version=2020-07-01", timeout=2).status_code == 400
    r = requests.get(imds.url + "/metadata/scheduledevents?api-version=2020-07-01", headers={"Metadata": "true"}, timeout=2)
    assert r.json()["Events"] == []


@pytest.mark.parametrize("imds", ["azure"], indirect=True)
def test_azure_preempt_is_acknowledged_only_when_the_agent_says_so(imds):
    events, stop, _ = watch(AzureWatcher(imds.url, poll_interval_s=POLL))
    try:
        state = imds.schedule_notice(deadline_in_s=30)
        event = next_event(events)
        assert imds.snapshot()["acknowledged"] == []
        event.acknowledge()
    finally:
        stop.set()
    assert abs(event.deadline.timestamp() - state["deadline"]) < 1.0
    assert imds.snapshot()["acknowledged"] == [state["event_id"]]
    doc = requests.get(imds.url + "/metadata/scheduledevents?api-version=2020-07-01", headers={"Metadata": "true"}, timeout=2).json()
    assert doc["Events"][0]["EventStatus"] == "Started" and doc["Events"][0]["NotBefore"] == ""


def test_sigterm_becomes_a_notice():
    events: queue.Queue = queue.Queue()
    previous = signal.getsignal(signal.SIGTERM)
    try:
        sigterm.install(events.put)
        os.kill(os.getpid(), signal.SIGTERM)
        event = next_event(events)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert event.source == NoticeSource.SIGTERM and event.deadline is None and event.raw == "SIGTERM"


@pytest.mark.parametrize("imds", ["aws"], indirect=True)
def test_metadata_control_calls_over_http(imds):
    r = requests.post(imds.url + "/_respawn/notice", json={"in_s": 0, "deadline_in_s": 90}, timeout=2)
    assert r.status_code == 200 and r.json()["deadline"] is not None
    r = requests.post(imds.url + "/_respawn/notice", json={"kind": "reboot"}, timeout=2)
    assert r.status_code == 400 and "reboot" in r.json()["error"]


@pytest.mark.parametrize("flavour, identity, expected", [
    ("aws", {"instance_id": "i-0abc123"}, "i-0abc123"),
    # Compute's numeric id and Azure's vmId GUID are not what our providers describe or terminate by.
    ("gcp", {"instance_id": "4837261", "name": "respawn-12", "zone": "us-central1-a"}, vm_id("us-central1-a", "respawn-12")),
    ("azure", {"instance_id": "3f2a9c1e-5b7d-4e0a-9c8b-1d2e3f4a5b6c", "name": "respawn-12"}, "respawn-12"),
])
def test_the_agent_names_its_vm_as_the_control_planes_provider_does(flavour, identity, expected):
    watchers = {"aws": AwsWatcher, "gcp": GcpWatcher, "azure": AzureWatcher}
    server = MetadataServer(flavour, **identity).start()
    try:
        assert watchers[flavour](server.url).instance_id() == expected
    finally:
        server.stop()
