"""A gang's ranks register at the same moment, each in its own transaction: the job
must still learn that every node registered (the CI run that left a gang's job in
`provisioning` while both its ranks trained to the end)."""

import pytest

from respawn_server.jobs.core.choices import InstanceState, JobStatus
from respawn_server.jobs.models import Instance, Job
from respawn_server.jobs.reports.registration import register_instance
from tests.factories import make_instance, make_job, make_team_with_members
from tests.overlap import in_overlapping_transactions


def register(instance: Instance) -> None:
    register_instance(instance, hostname=f"node-{instance.rank}", agent_version="t", provider_instance_id="")


@pytest.mark.django_db(transaction=True)
def test_two_ranks_registering_in_overlapping_transactions_move_the_job_to_running():
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, nodes=2, status=JobStatus.PROVISIONING)
    # As the local provider launches a gang: its rendezvous is known before any rank registers.
    ranks = [make_instance(job, rank=rank, rendezvous_addr="127.0.0.1:29500").instance for rank in range(2)]
    in_overlapping_transactions(lambda: register(ranks[1]), lambda: register(ranks[0]))
    assert set(Instance.objects.filter(job=job).values_list("state", flat=True)) == {InstanceState.RUNNING}
    assert Job.objects.get(pk=job.pk).status == JobStatus.RUNNING
