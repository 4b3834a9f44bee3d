"""GET rendezvous: how a gang's rank that registered before rank 0 learns rank 0's
address, which on a cloud is known only once rank 0 registers."""

import pytest
from rest_framework.test import APIClient

from respawn import protocol
from respawn_server.jobs.core.choices import JobStatus
from respawn_server.jobs.recovery.gangs import GANG_PORT
from tests.agent_api.helpers import AgentClient
from tests.factories import make_instance, make_job, make_team_with_members


def rendezvous(client: AgentClient):
    return client.client.get(protocol.API_PREFIX + protocol.PATH_RENDEZVOUS)


def registered(instance_setup, hostname: str) -> AgentClient:
    client = AgentClient()
    body = protocol.Register(bootstrap_token=instance_setup.bootstrap_token, hostname=hostname)
    response = client.post(protocol.PATH_REGISTER, body)
    assert response.status_code == 200, response.content
    client.use_token(response.json()["agent_token"])
    return client


@pytest.fixture
def team(db):
    return make_team_with_members()


def gang(team):
    job = make_job(team.team, team.people["member"].user, nodes=2, status=JobStatus.PROVISIONING)
    return make_instance(job, rank=0), make_instance(job, rank=1)


def test_a_rank_that_registers_first_reads_rank_0s_address_once_rank_0_registers(team):
    rank0, rank1 = gang(team)
    second = registered(rank1, "node-b")
    answer = rendezvous(second)
    assert answer.status_code == 200 and answer.json() == {"rendezvous_addr": ""}
    registered(rank0, "node-a")
    assert rendezvous(second).json() == {"rendezvous_addr": f"node-a:{GANG_PORT}"}


def test_rendezvous_needs_an_agent_token(team):
    _, rank1 = gang(team)
    registered(rank1, "node-b")
    assert APIClient().get(protocol.API_PREFIX + protocol.PATH_RENDEZVOUS).status_code == 401
    assert rendezvous(AgentClient("rsa_not-a-token")).status_code == 401


def test_an_instance_reads_only_its_own_gangs_address(team):
    first_rank0, _ = gang(team)
    _, other_rank1 = gang(team)
    registered(first_rank0, "node-a")
    other = registered(other_rank1, "node-z")
    assert rendezvous(other).json() == {"rendezvous_addr": ""}
