"""A small client for the REST API that turns every refusal into a CliError
with a message a person can act on and the matching exit code."""

from __future__ import annotations

import sys
import time

import requests

from respawn.cli.config import Credentials
from respawn.cli.errors import EXIT_AUTH, EXIT_BAD_INPUT, EXIT_FAILED, EXIT_NOT_FOUND, CliError

TIMEOUT_S = 30
# A web process restarting behind a proxy answers these for a moment.
RESTARTING = (502, 503, 504)


class Unreachable(CliError):
    """The control plane could not be reached, or the connection dropped mid-answer:
    asking again may well work (`Api.patiently`)."""


class FieldErrors(CliError):
    """The server rejected fields of the request body: {field: [message, ...]}."""

    def __init__(self, errors: dict):
        super().__init__("the server rejected the request", EXIT_BAD_INPUT)
        self.errors = errors


class Api:
    def __init__(self, url: str, token: str | None = None):
        self.url = url.rstrip("/")
        self.session = requests.Session()
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"

    @classmethod
    def signed_in(cls, credentials: Credentials) -> "Api":
        return cls(credentials.url, credentials.token)

    def get(self, path: str, **params):
        return self.request("GET", path, params={k: v for k, v in params.items() if v not in (None, "", [])})

    def post(self, path: str, body: dict | None = None):
        return self.request("POST", path, json=body)

    def request(self, method: str, path: str, **kwargs):
        response = self._send(method, path, **kwargs)
        return response.json() if response.content else None

    def get_text(self, path: str, **params) -> str:
        """As `get`, for an answer that is text, not JSON (a CSV)."""
        return self._send("GET", path, params={k: v for k, v in params.items() if v not in (None, "", [])}).text

    def _send(self, method: str, path: str, **kwargs) -> requests.Response:
        url = f"{self.url}/api/v1/{path.lstrip('/')}"
        try:
            response = self.session.request(method, url, timeout=TIMEOUT_S, **kwargs)
        except requests.RequestException as e:
            raise Unreachable(f"cannot reach the control plane at {self.url}: {e}") from e
        if response.status_code >= 400:
            raise refusal(response, what=f"{method} {path}")
        return response

    def patiently(self, call, *, for_s: float, first_wait_s: float = 0.5, max_wait_s: float = 10.0):
        """`call()`, asked again while the control plane is unreachable (a dropped
        connection, a web restart): after 0.5 s, 1 s, 2 s ... at most `max_wait_s`
        apart, for `for_s` seconds in all, then Unreachable saying so. A call that
        raised had no effect on what the caller holds (e.g. a cursor), so asking
        again neither repeats nor skips anything."""
        gave_up_at, wait = time.monotonic() + for_s, first_wait_s
        while True:
            try:
                return call()
            except Unreachable as e:
                left = gave_up_at - time.monotonic()
                if left <= 0:
                    raise Unreachable(f"gave up after {for_s:g}s of trying: {e.message}") from e
                wait = min(wait, max_wait_s, left)
                print(f"respawn: {e.message}; trying again in {wait:.1f}s", file=sys.stderr, flush=True)
                time.sleep(wait)
                wait *= 2

    def all_pages(self, path: str, **params) -> list[dict]:
        """Every row of a paginated list, following `next`."""
        page = self.get(path, limit=200, **params)
        rows = list(page["results"])
        while page.get("next"):
            page = self._follow(page["next"])
            rows += page["results"]
        return rows

    def _follow(self, absolute_url: str):
        try:
            response = self.session.get(absolute_url, timeout=TIMEOUT_S)
        except requests.RequestException as e:
            raise Unreachable(f"cannot reach the control plane at {self.url}: {e}") from e
        if response.status_code >= 400:
            raise refusal(response, what=absolute_url)
        return response.json()


def refusal(response: requests.Response, *, what: str) -> CliError:
    try:
        body = response.json()
    except ValueError:
        body = {}
    detail = body.get("detail") if isinstance(body, dict) else None
    code = response.status_code
    if code == 400 and isinstance(body, dict) and body.get("errors"):
        return FieldErrors(body["errors"])
    if code == 401:
        if detail and "expired" in detail.lower():
            return CliError("your API token has expired: run `respawn login` to get a new one", EXIT_AUTH)
        return CliError(f"the server refused your credentials ({detail or 'unauthorized'}): "
                        "run `respawn login`, or check RESPAWN_TOKEN", EXIT_AUTH)
    if code == 404:
        return CliError(f"not found: {what} (it does not exist, or not in your teams)", EXIT_NOT_FOUND)
    if code == 403:
        return CliError(f"not allowed: {detail or what}")
    if code in RESTARTING:
        return Unreachable(f"the control plane is not answering ({code}) on {what}")
    if code >= 500:
        return CliError(f"the control plane failed ({code}) on {what}; try again, or ask its operator")
    return CliError(detail or f"{what} answered {code}", EXIT_BAD_INPUT if code == 400 else EXIT_FAILED)
