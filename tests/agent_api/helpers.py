from __future__ import annotations

import uuid

from rest_framework.test import APIClient

from respawn import protocol


class AgentClient:
    """Speaks /api/agent/v1/ with the protocol dataclasses, as the agent does."""

    def __init__(self, token: str | None = None):
        self.client = APIClient()
        if token:
            self.use_token(token)

    def use_token(self, token: str):
        self.client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")

    def post(self, path: str, body):
        data = protocol.to_dict(body) if not isinstance(body, dict) else body
        return self.client.post(protocol.API_PREFIX + path, data, format="json")

    def register(self, bootstrap_token: str, event_id: str | None = None):
        body = protocol.Register(bootstrap_token=bootstrap_token, hostname="vm-1", agent_version="0.1",
                                 provider_instance_id="i-123", **({"event_id": event_id} if event_id else {}))
        response = self.post(protocol.PATH_REGISTER, body)
        if response.status_code == 200:
            self.use_token(response.json()["agent_token"])
        return response


def checkpoint_report(job, step: int, kind: str = protocol.CheckpointKind.PERIODIC, **extra) -> protocol.CheckpointReport:
    """A report of a checkpoint where the agent writes them: under the job's storage prefix."""
    fields = {"uri": checkpoint_uri(job, step), "bytes": 1024, "manifest_digest": "xxh3-128:abc", **extra}
    return protocol.CheckpointReport(checkpoint_id=str(uuid.uuid4()), step=step, kind=kind, **fields)


def checkpoint_uri(job, step: int) -> str:
    return f"{job.storage_uri}/step-{step:08d}"
