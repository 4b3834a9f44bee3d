"""HTTP calls to the control plane's agent API (DESIGN §5), with short timeouts.

Each call's outcome is one of three: delivered (2xx), retry later (unreachable,
timeout, 5xx, 429) or refused for good (any other 4xx: resending cannot help).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any

import requests

from respawn.protocol import API_PREFIX

log = logging.getLogger(__name__)

DOWNLOAD_CHUNK_BYTES = 1 << 20

DELIVERED = "delivered"
RETRY = "retry"
REFUSED = "refused"


@dataclass(frozen=True)
class Outcome:
    kind: str  # DELIVERED, RETRY or REFUSED
    status: int | None = None  # HTTP status; None when nothing came back
    answer: dict[str, Any] | None = None  # the decoded JSON object of a 2xx, if it was one
    detail: str = ""  # the raw body or the connection error, for logs


class ControlPlaneClient:
    def __init__(self, base_url: str, *, timeout_s: float = 5.0, connect_timeout_s: float = 2.0):
        self.base_url = base_url.rstrip("/") + API_PREFIX
        self.timeout = (connect_timeout_s, timeout_s)
        self.session = requests.Session()
        self.agent_token = ""  # set after register; kept in memory and the 0600 session file (respawn.agent.session)

    def post(self, path: str, body: dict[str, Any]) -> Outcome:
        return self._call("POST", path, body)

    def get(self, path: str) -> Outcome:
        """A read (the rendezvous address); the same three outcomes as a report."""
        return self._call("GET", path, None)

    def download(self, path: str, dest: str) -> tuple[Outcome, str]:
        """GET `path` into the file `dest`, streamed: the outcome, and the hex SHA-256 of the
        bytes written (empty unless delivered). A body cut short is a RETRY (requests
        checks it against the Content-Length)."""
        digest, size = hashlib.sha256(), 0
        try:
            with self.session.get(self.base_url + path, headers=self._auth(), timeout=self.timeout, stream=True) as r:
                refused = _refusal(r)
                if refused is not None:
                    return refused, ""
                with open(dest, "wb") as f:
                    for chunk in r.iter_content(DOWNLOAD_CHUNK_BYTES):
                        digest.update(chunk)
                        f.write(chunk)
                        size += len(chunk)
        except requests.RequestException as exc:
            return Outcome(RETRY, detail=f"{type(exc).__name__}: {exc}"), ""
        return Outcome(DELIVERED, r.status_code, detail=f"{size} bytes"), digest.hexdigest()

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.agent_token}"} if self.agent_token else {}

    def _call(self, method: str, path: str, body: dict[str, Any] | None) -> Outcome:
        try:
            r = self.session.request(method, self.base_url + path, json=body, headers=self._auth(), timeout=self.timeout)
        except requests.RequestException as exc:
            return Outcome(RETRY, detail=f"{type(exc).__name__}: {exc}")
        refused = _refusal(r)
        if refused is not None:
            return refused
        try:
            answer = r.json()
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            log.warning("control plane answered %s %s with a body that is not a JSON object: %r", r.status_code, path, r.text[:2000])
            answer = None
        return Outcome(DELIVERED, r.status_code, answer, r.text[:2000])


def _refusal(r: requests.Response) -> Outcome | None:
    """The outcome of an answer that is no success: RETRY for 5xx and 429, REFUSED for other 4xx."""
    if r.status_code >= 500 or r.status_code == 429:
        return Outcome(RETRY, r.status_code, detail=r.text[:2000])
    if r.status_code >= 400:
        return Outcome(REFUSED, r.status_code, detail=r.text[:2000])
    return None
