"""The metadata parsers never crash on arbitrary input: they return a notice or raise PayloadError."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from respawn.notices.aws import parse_instance_action, parse_rebalance
from respawn.notices.azure import parse_preempt_events
from respawn.notices.base import PayloadError
from respawn.notices.gcp import parse_preempted

NOW = datetime(2026, 11, 29, 22, 0, tzinfo=timezone.utc)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
documents = st.one_of(
    st.text(max_size=200),
    json_values.map(json.dumps),
    st.fixed_dictionaries({"action": json_values | st.sampled_from(["terminate", "stop"]), "time": json_values | st.just("2026-11-29T22:02:00Z")}).map(json.dumps),
    st.fixed_dictionaries({"Events": st.lists(st.fixed_dictionaries({"EventId": json_values, "EventType": st.just("Preempt"), "NotBefore": json_values, "Resources": json_values | st.just(["vm-1"])}), max_size=3)}).map(json.dumps),
)


def settles(parse, raw):
    try:
        return parse(raw)
    except PayloadError:
        return None


@settings(max_examples=300, deadline=None)
@given(documents)
def test_parsers_answer_or_raise_payload_error(raw):
    settles(lambda r: parse_instance_action(r, NOW), raw)
    settles(lambda r: parse_rebalance(r, NOW), raw)
    settles(lambda r: parse_preempt_events(r, NOW, "vm-1"), raw)
    settles(parse_preempted, raw)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["terminate", "stop", "hibernate"]), json_values)
def test_a_valid_aws_action_is_a_notice_whatever_the_time_says(action, time_value):
    event = parse_instance_action(json.dumps({"action": action, "time": time_value}), NOW)
    assert event.notice_time == NOW


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=1, max_size=30), json_values)
def test_every_azure_preempt_event_with_an_id_is_found_whatever_its_not_before(event_id, not_before):
    good = {"EventId": "A-1", "EventType": "Preempt", "NotBefore": "Sun, 29 Nov 2026 22:00:30 GMT", "Resources": ["vm-1"]}
    odd = {"EventId": event_id, "EventType": "Preempt", "NotBefore": not_before, "Resources": ["vm-1"]}
    found = dict(parse_preempt_events(json.dumps({"DocumentIncarnation": 2, "Events": [odd, good]}), NOW, "vm-1"))
    assert found["A-1"] == NOW + timedelta(seconds=30)
    assert event_id in found


def test_a_started_azure_event_is_due_now_and_not_garbage(caplog):
    """Once acknowledged (or due), Azure serves the event Started with an empty NotBefore."""
    started = {"EventId": "A-1", "EventType": "Preempt", "EventStatus": "Started", "NotBefore": "", "Resources": ["vm-1"]}
    assert parse_preempt_events(json.dumps({"DocumentIncarnation": 3, "Events": [started]}), NOW, "vm-1") == [("A-1", NOW)]
    assert not caplog.records
