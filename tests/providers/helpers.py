"""Helpers for the provider tests: the launch request every test builds on, and a
reader of what moto received."""

from __future__ import annotations

import base64
import json
import uuid
from urllib.parse import parse_qsl

import requests

from respawn_server.jobs.fleet.agent_dist import AgentDist
from respawn_server.jobs.fleet.providers.base import LaunchRequest, Placement, render_user_data


class MotoRecorder:
    """What the moto server received, through its own request recorder."""

    def __init__(self, url: str):
        self.url = url

    def start(self) -> None:
        requests.post(f"{self.url}/moto-api/recorder/reset-recording", timeout=60).raise_for_status()
        requests.post(f"{self.url}/moto-api/recorder/start-recording", timeout=60).raise_for_status()

    def calls(self, action: str) -> list[dict[str, str]]:
        """The form parameters of every recorded call of this EC2 action, in order."""
        text = requests.get(f"{self.url}/moto-api/recorder/download-recording", timeout=60).text
        found = []
        for line in filter(None, text.splitlines()):
            entry = json.loads(line)
            body = base64.b64decode(entry["body"]).decode() if entry.get("body_encoded") else entry.get("body") or ""
            params = dict(parse_qsl(body))
            if params.get("Action") == action:
                found.append(params)
        return found


AGENT = AgentDist(version="0.1.0", wheel="respawn_ml-0.1.0-py3-none-any.whl", wheel_sha256="ab" * 32,
                  requirements_sha256="cd" * 32)
USER_DATA = render_user_data(control_plane_url="http://127.0.0.1:8000", bootstrap_token="boot-tok-1", provider="test",
                             agent=AGENT)


def client_token(instance_id: int) -> str:
    """The UUID the control plane would have made for this Instance row (stable per id here)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"respawn-test-instance/{instance_id}"))


def make_request(*, provider: str, region: str, zone: str, instance_type: str, market: str, instance_id: int = 11, **kw) -> LaunchRequest:
    kw.setdefault("client_token", client_token(instance_id))
    return LaunchRequest(
        job_id=7,
        instance_id=instance_id,
        placement=Placement(provider=provider, region=region, zone=zone, instance_type=instance_type, market=market),
        user_data=USER_DATA,
        **kw,
    )
