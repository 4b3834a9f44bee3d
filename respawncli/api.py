"""A small client for the REST API that turns every refusal into a CliError
with a message a person can act on and the matching exit code."""

from __future__ import annotations

import requests

from respawncli.config import Credentials
from respawncli.errors import EXIT_AUTH, EXIT_BAD_INPUT, EXIT_FAILED, EXIT_NOT_FOUND, CliError

TIMEOUT_S = 30


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
        url = f"{self.url}/api/v1/{path.lstrip('/')}"
        try:
            response = self.session.request(method, url, timeout=TIMEOUT_S, **kwargs)
        except requests.RequestException as e:
            raise CliError(f"cannot reach the control plane at {self.url}: {e}") from e
        if response.status_code >= 400:
            raise refusal(response, what=f"{method} {path}")
        return response.json() if response.content else None

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
            raise CliError(f"cannot reach the control plane at {self.url}: {e}") from e
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
    if code >= 500:
        return CliError(f"the control plane failed ({code}) on {what}; try again, or ask its operator")
    return CliError(detail or f"{what} answered {code}", EXIT_BAD_INPUT if code == 400 else EXIT_FAILED)
