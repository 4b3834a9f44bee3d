"""Every VM of a job is handed the same experiment-tracker run id at register, and no two
jobs share one (agents/respawn/trackers.py makes the trackers' variables of it)."""

from respawn_server.jobs.core.choices import EndReason, InstanceState, JobStatus
from respawn_server.jobs.models import Instance
from tests.agent_api.helpers import AgentClient
from tests.factories import make_instance, make_job, make_team_with_members


def register(job) -> dict:
    response = AgentClient().register(make_instance(job).bootstrap_token)
    assert response.status_code == 200, response.content
    return response.json()["job"]


def test_a_relaunched_job_gets_the_run_id_its_first_vm_got_and_another_job_another(db):
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.PROVISIONING)
    first = register(job)
    Instance.objects.filter(job=job).update(state=InstanceState.ENDED, end_reason=EndReason.PREEMPTED)
    relaunched = register(job)
    assert first["instance_id"] != relaunched["instance_id"]
    assert first["run_id"] == relaunched["run_id"] and first["run_id"].startswith(f"respawn-{job.pk}-")
    other = make_job(setup.team, setup.people["member"].user, status=JobStatus.PROVISIONING)
    assert register(other)["run_id"] != first["run_id"]
