"""A bootstrap token opens one registration, even when raced; an agent token
dies with its instance once the grace window has passed, on every endpoint."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import requests
from django.utils import timezone

from respawn import protocol
from respawn_server.jobs.core.choices import EndReason, InstanceState
from respawn_server.jobs.models import Instance
from tests.agent_api.helpers import AgentClient, checkpoint_report
from tests.factories import make_instance, make_job

RACERS = 8


def test_racing_registrations_with_one_bootstrap_token_give_exactly_one_agent_token(team_setup, web_server):
    job = make_job(team_setup.team, team_setup.people["admin"].user)
    setup = make_instance(job)

    def register(_):
        body = protocol.to_dict(protocol.Register(bootstrap_token=setup.bootstrap_token, hostname="vm",
                                                  agent_version="1", provider_instance_id="i-1"))
        return requests.post(web_server.url + "/api/agent/v1/register", json=body, timeout=30)

    with ThreadPoolExecutor(RACERS) as pool:
        answers = list(pool.map(register, range(RACERS)))
    codes = sorted(a.status_code for a in answers)
    assert codes == [200] + [401] * (RACERS - 1), [a.text for a in answers]
    winner = next(a for a in answers if a.status_code == 200).json()["agent_token"]
    heartbeat = requests.post(web_server.url + "/api/agent/v1/heartbeat", timeout=10,
                              headers={"Authorization": f"Bearer {winner}"},
                              json=protocol.to_dict(protocol.Heartbeat(step=1)))
    assert heartbeat.status_code == 200


def test_a_bootstrap_token_of_an_ended_instance_registers_nothing(team_setup):
    setup = make_instance(make_job(team_setup.team, team_setup.people["admin"].user))
    Instance.objects.filter(pk=setup.instance.pk).update(state=InstanceState.ENDED, end_reason=EndReason.LOST,
                                                         ended_at=timezone.now())
    assert AgentClient().register(setup.bootstrap_token).status_code == 401
    assert not Instance.objects.get(pk=setup.instance.pk).agent_token_hash


def every_agent_report(job, checkpoint_id: str):
    return [
        (protocol.PATH_HEARTBEAT, protocol.Heartbeat(step=5)),
        ("notice", {"event_id": str(uuid.uuid4()), "source": "aws_imds", "notice_time": "2026-11-29T22:00:00Z"}),
        ("prepare", {"event_id": str(uuid.uuid4()), "outcome": "failed", "message": "late"}),
        ("checkpoints", checkpoint_report(job, 5)),
        (f"checkpoints/{checkpoint_id}/validation", {"event_id": str(uuid.uuid4()), "result": "valid"}),
        ("logs", protocol.LogBatch(offset=0, lines=["late"])),
        ("exit", {"event_id": str(uuid.uuid4()), "reason": "preempted"}),
    ]


# Within the grace window an ended instance delivers what it did; what would steer its
# job (a notice, a prepare report) is refused (DESIGN §5), and its heartbeats are answered `stop`.
WITHIN_GRACE = {protocol.PATH_HEARTBEAT: 200, "notice": 401, "prepare": 401, "checkpoints": 200, "validation": 200,
                "logs": 200, "exit": 200}


@pytest.mark.parametrize("ended_ago_s", [590, 610])
def test_an_ended_instances_token_works_within_the_grace_window_and_nowhere_after(team_setup, settings, ended_ago_s):
    settings.RESPAWN = {**settings.RESPAWN, "FENCE_GRACE_S": 600.0}
    job = make_job(team_setup.team, team_setup.people["admin"].user)
    setup = make_instance(job, state=InstanceState.RUNNING, registered=True)
    agent = AgentClient(setup.agent_token)
    report = checkpoint_report(job, 3)
    assert agent.post("checkpoints", report).status_code == 200
    Instance.objects.filter(pk=setup.instance.pk).update(
        state=InstanceState.ENDED, end_reason=EndReason.FENCED, ended_at=timezone.now() - timedelta(seconds=ended_ago_s))
    codes = {path.split("/")[-1]: agent.post(path, body).status_code
             for path, body in every_agent_report(job, report.checkpoint_id)}
    assert codes == (WITHIN_GRACE if ended_ago_s < 600 else {path: 401 for path in WITHIN_GRACE})
    if ended_ago_s > 600:
        assert "revoked" in agent.post(protocol.PATH_HEARTBEAT, protocol.Heartbeat(step=6)).json()["detail"]
