"""AWS spot notices through IMDSv2 (DESIGN §7).

A session token is fetched with `PUT /latest/api/token` and refreshed on a 401
(expired or unknown token). `spot/instance-action` answers 404 until AWS
decides to reclaim the instance, then `{"action": ..., "time": ISO 8601}` where
`time` is when it goes. The rebalance recommendation is an earlier, softer
signal: it is reported, not acted on.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime

import requests

from respawn.notices.base import (
    PREEMPT,
    REBALANCE,
    NoticeEvent,
    PayloadError,
    PollingWatcher,
    log_garbage,
    plausible_deadline,
    truncate_raw,
    utcnow,
)
from respawn.protocol import NoticeSource

log = logging.getLogger(__name__)

TOKEN_PATH = "/latest/api/token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
INSTANCE_ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
INSTANCE_ID_PATH = "/latest/meta-data/instance-id"
ACTIONS = ("terminate", "stop", "hibernate")
TOKEN_TTL_S = 21600


def parse_time(value: object, field: str) -> datetime:
    if not isinstance(value, str):
        raise PayloadError(f"{field} is {type(value).__name__}, expected an ISO 8601 string")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise PayloadError(f"{field} {value!r} is not ISO 8601") from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=utcnow().tzinfo)


def parse_instance_action(raw: str, now: datetime, source: str = NoticeSource.AWS_IMDS) -> NoticeEvent:
    """The notice in a 200 answer of `spot/instance-action`; PayloadError if it is not one.

    A valid `action` with an unusable `time` is still a notice (with no deadline):
    AWS only serves this document when the instance is being reclaimed.
    """
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise PayloadError(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise PayloadError(f"expected a JSON object, got {type(doc).__name__}")
    action = doc.get("action")
    if action not in ACTIONS:
        raise PayloadError(f"action {action!r} is not one of {', '.join(ACTIONS)}")
    try:
        deadline = plausible_deadline(parse_time(doc.get("time"), "time"), now, raw, source)
    except PayloadError as exc:
        log_garbage(source, exc, raw)
        deadline = None
    return NoticeEvent(source=source, kind=PREEMPT, notice_time=now, deadline=deadline, raw=truncate_raw(raw))


def parse_rebalance(raw: str, now: datetime, source: str = NoticeSource.AWS_IMDS) -> NoticeEvent:
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise PayloadError(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise PayloadError(f"expected a JSON object, got {type(doc).__name__}")
    notice_time = parse_time(doc.get("noticeTime"), "noticeTime")
    return NoticeEvent(source=source, kind=REBALANCE, notice_time=notice_time, deadline=None, raw=truncate_raw(raw))


class AwsWatcher(PollingWatcher):
    source = NoticeSource.AWS_IMDS
    window_s = 120.0  # the two-minute spot interruption notice

    def __init__(self, base_url: str = "http://169.254.169.254", *, poll_interval_s: float = 5.0, timeout_s: float = 2.0):
        super().__init__(base_url, poll_interval_s=poll_interval_s, timeout_s=timeout_s)
        self._token = ""

    def _fetch_token(self) -> str:
        r = self.session.put(self.base_url + TOKEN_PATH, headers={TTL_HEADER: str(TOKEN_TTL_S)}, timeout=self.timeout_s)
        if r.status_code != 200 or not r.text:
            raise requests.RequestException(f"IMDSv2 token request answered {r.status_code}: {r.text[:200]!r}")
        return r.text

    def get(self, path: str) -> requests.Response:
        """GET with the session token, fetching a fresh one when it is missing or refused."""
        for attempt in range(2):
            if not self._token:
                self._token = self._fetch_token()
            r = self.session.get(self.base_url + path, headers={TOKEN_HEADER: self._token}, timeout=self.timeout_s)
            if r.status_code != 401:
                return r
            self._token = ""
        return r

    def poll(self) -> list[tuple[str, NoticeEvent]]:
        found = []
        now = utcnow()
        r = self.get(INSTANCE_ACTION_PATH)
        if r.status_code == 200:
            if "instance-action" not in self.emitted:
                try:
                    found.append(("instance-action", parse_instance_action(r.text, now, self.source)))
                except PayloadError as exc:
                    log_garbage(self.source, exc, r.text)
        elif r.status_code != 404:
            log_garbage(self.source, PayloadError(f"HTTP {r.status_code} on {INSTANCE_ACTION_PATH}"), r.text)
        try:  # a failure here must not hide the instance-action notice found above
            r = self.get(REBALANCE_PATH)
        except requests.RequestException as exc:
            log.info("%s: rebalance recommendation unreadable (%s)", self.source, exc)
            return found
        if r.status_code == 200 and "rebalance" not in self.emitted:
            try:
                found.append(("rebalance", parse_rebalance(r.text, now, self.source)))
            except PayloadError as exc:
                log_garbage(self.source, exc, r.text)
        return found

    def instance_id(self) -> str:
        r = self.get(INSTANCE_ID_PATH)
        return r.text.strip() if r.status_code == 200 else ""
