"""An on-demand VM registers like a spot one: nothing interrupts it, so its checkpoint
interval's inputs are unbounded, and they are stored as such (JSON has no infinity)."""

from respawn_server.jobs.core.choices import JobStatus, Market
from respawn_server.jobs.models import Instance
from tests.agent_api.helpers import AgentClient
from tests.factories import make_instance, make_job, make_team_with_members


def test_an_on_demand_vm_registers_and_its_unbounded_interval_inputs_are_stored(db):
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.PROVISIONING)
    instance = make_instance(job, market=Market.ON_DEMAND)
    response = AgentClient().register(instance.bootstrap_token)
    assert response.status_code == 200, response.content
    interval = Instance.objects.get(pk=instance.instance.pk).checkpoint_interval
    assert interval["unnoticed_mtbi_s"] is None and interval["young_daly_s"] is None
    assert interval["seconds"] == 1200.0 and interval["source"] == "maximum"
