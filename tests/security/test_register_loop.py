"""A spec no VM can be served is refused at submit, and a register the server cannot
answer ends as a setup failure after a bounded number of tries, never as a capacity
error and a relaunch, forever and billed (issue 16, item 5)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from respawn_server.jobs.core.choices import EndReason, FailureCause, InstanceState, JobStatus
from respawn_server.jobs.fleet.reconciler import retry_stuck_provisioning
from respawn_server.jobs.models import Instance, Job
from respawn_server.jobs.reports.registration import REGISTER_MAX_FAILURES
from tests.agent_api.helpers import AgentClient
from tests.factories import make_instance, make_job


@pytest.mark.parametrize("field, value", [("checkpoint_every_steps", 0), ("checkpoint_every_steps", -3),
                                          ("checkpoint_interval_s", 0), ("checkpoint_interval_s", -1.5)])
def test_a_non_positive_checkpoint_interval_is_refused_at_submit_naming_the_field(team_setup, field, value):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {team_setup.people['member'].token}")
    response = client.post("/api/v1/jobs/", {"team": team_setup.team.pk, "name": "x", "command": ["python", "t.py"],
                                             field: value}, format="json")
    assert response.status_code == 400 and field in response.json()["errors"], response.content
    assert not Job.objects.exists()


def unservable_job(team_setup) -> Job:
    """As a job submitted before the check above: its VMs' register cannot be answered."""
    return make_job(team_setup.team, team_setup.people["member"].user, status=JobStatus.PROVISIONING,
                    checkpoint_every_steps=0)


def test_failed_registers_fail_the_job_as_setup_after_a_bounded_number(team_setup, settings):
    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": []}
    job = unservable_job(team_setup)
    vm = make_instance(job)
    agent = AgentClient()
    answers = [agent.register(vm.bootstrap_token) for _ in range(REGISTER_MAX_FAILURES)]  # the agent's retries
    assert [a.status_code for a in answers] == [500] * REGISTER_MAX_FAILURES
    assert "could not answer this register" in answers[0].json()["detail"]

    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and job.failure_cause == FailureCause.SETUP
    assert "failed 5 registers" in job.failure_message and "ValueError" in job.failure_message
    instance = Instance.objects.get(pk=vm.instance.pk)
    assert (instance.state, instance.end_reason) == (InstanceState.ENDED, EndReason.FAILED)
    assert agent.register(vm.bootstrap_token).status_code == 401  # the agent exits for good (EXIT_INSTANCE_ENDED)
    assert Instance.objects.filter(job=job).count() == 1  # nothing relaunched
    assert job.events.filter(message__contains="failed to answer the register").count() == REGISTER_MAX_FAILURES


def test_a_vm_that_gave_up_registering_is_no_capacity_error(team_setup, settings):
    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": []}
    job = unservable_job(team_setup)
    vm = make_instance(job)
    assert AgentClient().register(vm.bootstrap_token).status_code == 500  # then its agent died
    Instance.objects.filter(pk=vm.instance.pk).update(requested_at=timezone.now() - timedelta(hours=1))

    retry_stuck_provisioning()

    instance = Instance.objects.get(pk=vm.instance.pk)
    assert instance.end_reason == EndReason.FAILED  # its zone had capacity: no back-off for anyone
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and job.failure_cause == FailureCause.SETUP
    assert "never registered" in job.failure_message
