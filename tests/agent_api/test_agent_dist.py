"""GET dist/{file} and POST setup-failed: what a VM's boot script may ask before its
agent registers (DESIGN §11), and to whom the control plane answers."""

from __future__ import annotations

import hashlib
import uuid

import pytest

from respawn import protocol
from respawn_server.jobs.core.choices import FailureCause, InstanceState, JobStatus
from respawn_server.jobs.models import Instance
from tests.agent_api.helpers import AgentClient
from tests.factories import make_instance, make_job, make_team_with_members

pytestmark = pytest.mark.django_db


@pytest.fixture
def job():
    setup = make_team_with_members()
    return make_job(setup.team, setup.people["member"].user)


def fetch(client: AgentClient, name: str):
    return client.client.get(f"{protocol.API_PREFIX}dist/{name}")


def body(response) -> bytes:
    return b"".join(response.streaming_content)


def test_it_serves_the_pinned_wheel_and_requirements_to_the_bootstrap_token(job, agent_wheel):
    vm = make_instance(job, state=InstanceState.BOOTING)
    client = AgentClient(vm.bootstrap_token)
    wheel = fetch(client, agent_wheel.wheel_file)
    assert wheel.status_code == 200
    assert hashlib.sha256(body(wheel)).hexdigest() == agent_wheel.wheel_sha256
    requirements = body(fetch(client, agent_wheel.requirements_file)).decode()
    assert hashlib.sha256(requirements.encode()).hexdigest() == agent_wheel.requirements_sha256
    assert "requests==" in requirements and all("==" in line for line in requirements.splitlines())


def test_the_agent_token_may_fetch_it_too_and_a_used_bootstrap_token_may_not(job, agent_wheel):
    vm = make_instance(job, state=InstanceState.BOOTING)
    client = AgentClient()
    assert client.register(vm.bootstrap_token).status_code == 200  # now holds the agent token
    assert fetch(client, agent_wheel.wheel_file).status_code == 200
    client.use_token(vm.bootstrap_token)
    assert fetch(client, agent_wheel.wheel_file).status_code == 401


@pytest.mark.parametrize("token", ["", "rb_not-a-token", "Basic abc"])
def test_a_wrong_token_is_a_401(job, agent_wheel, token):
    make_instance(job, state=InstanceState.BOOTING)
    client = AgentClient(token) if token.startswith("rb_") else AgentClient()
    if token.startswith("Basic"):
        client.client.credentials(HTTP_AUTHORIZATION=token)
    assert fetch(client, agent_wheel.wheel_file).status_code == 401


def test_an_ended_instances_bootstrap_token_is_a_401(job, agent_wheel):
    vm = make_instance(job, state=InstanceState.ENDED)
    assert fetch(AgentClient(vm.bootstrap_token), agent_wheel.wheel_file).status_code == 401


@pytest.mark.parametrize("name", ["agent.json", "..%2Fagent.json", f"respawn-agent-{'0' * 64}.whl", "secret_key"])
def test_nothing_else_of_the_control_plane_is_served(job, agent_wheel, name):
    vm = make_instance(job, state=InstanceState.BOOTING)
    assert fetch(AgentClient(vm.bootstrap_token), name).status_code == 404


def report_setup_failure(client: AgentClient, **fields):
    return client.post("setup-failed", {"event_id": str(uuid.uuid4()), **fields})


def test_a_setup_failure_fails_the_job_with_its_reason_and_ends_its_vms(job, django_capture_on_commit_callbacks):
    job.status = JobStatus.PROVISIONING
    job.save()
    vm = make_instance(job, state=InstanceState.BOOTING)
    with django_capture_on_commit_callbacks(execute=False) as queued:
        answer = report_setup_failure(AgentClient(vm.bootstrap_token), message="the agent's whl has SHA-256 f00")
    assert answer.status_code == 200, answer.content
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and job.failure_cause == FailureCause.SETUP
    assert "the VM could not set up the agent: the agent's whl has SHA-256 f00" in job.failure_message
    assert Instance.objects.get(pk=vm.instance.pk).state == InstanceState.ENDED
    assert queued  # the VM's terminate, sent once the transaction commits


def test_setup_failed_takes_only_an_unused_bootstrap_token_and_a_message(job):
    vm = make_instance(job, state=InstanceState.BOOTING)
    client = AgentClient(vm.bootstrap_token)
    missing = report_setup_failure(client)
    assert missing.status_code == 400 and "message" in missing.json()["errors"]
    assert report_setup_failure(client, message="x" * 501).status_code == 400
    assert client.register(vm.bootstrap_token).status_code == 200
    assert report_setup_failure(client, message="late").status_code == 401  # an agent reports in its exit
    client.use_token(vm.bootstrap_token)
    assert report_setup_failure(client, message="late").status_code == 401
