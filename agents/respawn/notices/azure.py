"""Azure spot eviction through Scheduled Events (DESIGN §7).

`GET /metadata/scheduledevents` (header `Metadata: true`) lists pending events;
a spot eviction is `EventType: "Preempt"` with an RFC 1123 `NotBefore`. The
agent acknowledges it (`StartRequests`) only after the notice checkpoint has
committed, because acknowledging lets the platform evict at once.

Azure sends the events of every VM in an availability set or a scale set's
placement group to all of them; an event's `Resources` names the VMs it is for.
Only an event naming this VM (its `compute/name`) is a notice here: acting on a
neighbour's would checkpoint and stop for nothing, and acknowledging it would
start the neighbour's eviction early.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Container
from datetime import datetime
from email.utils import parsedate_to_datetime

from respawn.notices.base import PREEMPT, NoticeEvent, PayloadError, PollingWatcher, log_garbage, plausible_deadline, truncate_raw, utcnow
from respawn.protocol import NoticeSource

log = logging.getLogger(__name__)

EVENTS_PATH = "/metadata/scheduledevents"
NAME_PATH = "/metadata/instance/compute/name"
API_VERSION = "2020-07-01"
HEADERS = {"Metadata": "true"}


def parse_not_before(value: object) -> datetime:
    if not isinstance(value, str) or not value.strip():
        raise PayloadError(f"NotBefore {value!r} is not an RFC 1123 time")
    try:
        return parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError) as exc:
        raise PayloadError(f"NotBefore {value!r} is not an RFC 1123 time") from exc


def parse_preempt_events(raw: str, now: datetime, vm_name: str, known: Container[str] = ()) -> list[tuple[str, datetime | None]]:
    """`(EventId, deadline)` of each Preempt event for `vm_name` in a scheduledevents document,
    but those `known` (emitted already: read again, a past NotBefore would be warned of each poll).

    A malformed event is logged and skipped without hiding the others; a
    malformed document raises PayloadError.
    """
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise PayloadError(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("Events"), list):
        raise PayloadError("expected an object with an Events list")
    found = []
    for event in doc["Events"]:
        if not isinstance(event, dict) or event.get("EventType") != "Preempt":
            continue
        event_id = event.get("EventId")
        if not isinstance(event_id, str) or not event_id:
            log_garbage(NoticeSource.AZURE_SCHEDULED_EVENTS, PayloadError(f"Preempt event without an EventId: {event!r}"), raw)
            continue
        resources = event.get("Resources")
        if not isinstance(resources, list):
            log_garbage(NoticeSource.AZURE_SCHEDULED_EVENTS, PayloadError(f"Preempt event without a Resources list: {event!r}"), raw)
            continue
        if not any(isinstance(r, str) and r.casefold() == vm_name.casefold() for r in resources):
            continue  # a neighbour's (VM names are case-insensitive in Azure)
        if event_id in known:
            continue
        if event.get("EventStatus") == "Started" and event.get("NotBefore") == "":
            found.append((event_id, now))  # acknowledged or due: Azure blanks NotBefore, the eviction is under way
            continue
        try:
            deadline = plausible_deadline(parse_not_before(event.get("NotBefore")), now, raw, NoticeSource.AZURE_SCHEDULED_EVENTS)
        except PayloadError as exc:
            log_garbage(NoticeSource.AZURE_SCHEDULED_EVENTS, exc, raw)
            deadline = None
        found.append((event_id, deadline))
    return found


class AzureWatcher(PollingWatcher):
    source = NoticeSource.AZURE_SCHEDULED_EVENTS
    window_s = 30.0  # a Spot eviction's Preempt event: NotBefore at least 30 s ahead

    def __init__(self, base_url: str = "http://169.254.169.254", *, poll_interval_s: float = 1.0, timeout_s: float = 2.0):
        super().__init__(base_url, poll_interval_s=poll_interval_s, timeout_s=timeout_s)
        self._vm_name = ""

    def poll(self) -> list[tuple[str, NoticeEvent]]:
        vm_name = self.instance_id()
        if not vm_name:  # cannot tell our events from a neighbour's yet; asked again next poll
            log.warning("%s: %s did not answer this VM's name; events are read once it does", self.source, NAME_PATH)
            return []
        r = self.session.get(self.base_url + EVENTS_PATH, params={"api-version": API_VERSION}, headers=HEADERS, timeout=self.timeout_s)
        if r.status_code != 200:
            log_garbage(self.source, PayloadError(f"HTTP {r.status_code} on {EVENTS_PATH}"), r.text)
            return []
        now = utcnow()
        try:
            events = parse_preempt_events(r.text, now, vm_name, known=self.emitted)
        except PayloadError as exc:
            log_garbage(self.source, exc, r.text)
            return []
        return [
            (event_id, NoticeEvent(source=self.source, kind=PREEMPT, notice_time=now, deadline=deadline, raw=truncate_raw(r.text), acknowledge=self._acknowledger(event_id)))
            for event_id, deadline in events
        ]

    def _acknowledger(self, event_id: str):
        def acknowledge() -> None:
            body = json.dumps({"StartRequests": [{"EventId": event_id}]})
            r = self.session.post(self.base_url + EVENTS_PATH, params={"api-version": API_VERSION}, headers={**HEADERS, "Content-Type": "application/json"}, data=body, timeout=self.timeout_s)
            if r.status_code != 200:
                log.warning("%s: acknowledging event %s answered %s: %r", self.source, event_id, r.status_code, r.text[:500])

        return acknowledge

    def instance_id(self) -> str:
        """The VM's name: what the control plane's Azure provider calls it (not the vmId GUID),
        and what an event's `Resources` names. Asked until answered, then kept."""
        if not self._vm_name:
            r = self.session.get(self.base_url + NAME_PATH, params={"api-version": "2021-02-01", "format": "text"}, headers=HEADERS, timeout=self.timeout_s)
            self._vm_name = r.text.strip() if r.status_code == 200 else ""
        return self._vm_name
