"""GCP preemption through the metadata server (DESIGN §7).

`instance/preempted` answers `FALSE` until the VM is preempted, then `TRUE`;
the watcher long-polls it with `wait_for_change=true` and the last `ETag`, so a
change is seen the moment it happens, and reconnects after a dropped connection
or a timeout. GCP also sends the ACPI shutdown (SIGTERM) and allows 30 s.
"""

from __future__ import annotations

from datetime import timedelta

import requests

from respawn.notices.base import PREEMPT, NoticeEvent, PayloadError, PollingWatcher, log_garbage, truncate_raw, utcnow
from respawn.protocol import NoticeSource

PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
NAME_PATH = "/computeMetadata/v1/instance/name"
ZONE_PATH = "/computeMetadata/v1/instance/zone"  # projects/<number>/zones/<zone>
HEADERS = {"Metadata-Flavor": "Google"}
PREEMPTION_WINDOW = timedelta(seconds=30)


def parse_preempted(raw: str) -> bool:
    value = raw.strip()
    if value not in ("TRUE", "FALSE"):
        raise PayloadError(f"expected TRUE or FALSE, got {value[:40]!r}")
    return value == "TRUE"


class GcpWatcher(PollingWatcher):
    source = NoticeSource.GCP_METADATA
    window_s = PREEMPTION_WINDOW.total_seconds()

    def __init__(self, base_url: str = "http://metadata.google.internal", *, poll_interval_s: float = 1.0, timeout_s: float = 2.0, wait_s: float = 60.0):
        super().__init__(base_url, poll_interval_s=poll_interval_s, timeout_s=timeout_s)
        self.wait_s = wait_s
        self._etag = ""  # empty: next request is a plain read that learns the ETag
        self._long_polled = False

    def poll(self) -> list[tuple[str, NoticeEvent]]:
        self._long_polled = False
        params, timeout = {}, self.timeout_s
        if self._etag:
            params = {"wait_for_change": "true", "last_etag": self._etag, "timeout_sec": str(int(self.wait_s))}
            timeout = self.wait_s + self.timeout_s + 5
        try:
            r = self.session.get(self.base_url + PREEMPTED_PATH, params=params, headers=HEADERS, timeout=timeout)
        except requests.RequestException:
            self._etag = ""  # reconnect with a plain read: a change may have happened meanwhile
            raise
        if r.status_code != 200:
            log_garbage(self.source, PayloadError(f"HTTP {r.status_code} on {PREEMPTED_PATH}"), r.text)
            self._etag = ""
            return []
        try:
            preempted = parse_preempted(r.text)
        except PayloadError as exc:
            log_garbage(self.source, exc, r.text)
            self._etag = ""
            return []
        self._etag = r.headers.get("ETag", "")
        self._long_polled = bool(self._etag)
        if not preempted:
            return []
        now = utcnow()
        return [("preempted", NoticeEvent(source=self.source, kind=PREEMPT, notice_time=now, deadline=now + PREEMPTION_WINDOW, raw=truncate_raw(r.text)))]

    def wait_after_poll(self) -> float:
        # A good long-poll answer is followed at once by the next long-poll; errors back off.
        return 0.0 if self._long_polled else self.poll_interval_s

    def instance_id(self) -> str:
        """The VM as the control plane's GCP provider names it, `<zone>/<name>` (names are
        unique per zone only); not the numeric instance/id, which no API call of ours takes."""
        values = []
        for path in (ZONE_PATH, NAME_PATH):
            r = self.session.get(self.base_url + path, headers=HEADERS, timeout=self.timeout_s)
            if r.status_code != 200 or not r.text.strip():
                return ""
            values.append(r.text.strip())
        return f"{values[0].rpartition('/')[2]}/{values[1]}"
