"""An Azure spot VM evicted with policy Deallocate stays, stopped, with its OS disk
billed by the month: the control plane deletes it, records when it saw it gone, and
the ledger bills the disk from the instance's end to then. Driven through the real
azure-mgmt-compute client against the ARM emulator."""

import datetime as dt
from decimal import Decimal

import pytest
from django.db.models import F

from respawn.protocol import ExitReason
from respawn_server.jobs.core.choices import EndReason, InstanceState
from respawn_server.jobs.fleet.launcher import launch
from respawn_server.jobs.fleet.leftovers import release_stopped_disks
from respawn_server.jobs.fleet.providers.base import CloudState
from respawn_server.jobs.fleet.reconciler import confirm_silent
from respawn_server.jobs.fleet.registry import provider_for
from respawn_server.jobs.fleet.scheduler import schedule
from respawn_server.jobs.models import DiskPriceQuote, Instance, InstanceEvent
from respawn_server.jobs.money import costs
from respawn_server.jobs.money.ledger import HOURS_PER_MONTH, MONEY_QUANTUM
from respawn_server.jobs.reports.exits import record_exit
from tests.emulators.azure_compute import AzureComputeEmulator
from tests.factories import make_job, make_team_with_members
from tests.providers.test_azure import SUBNET, StaticToken

EVICTED_FOR = dt.timedelta(hours=2)


@pytest.fixture(scope="module")
def arm():
    with AzureComputeEmulator() as emulator:
        yield emulator


@pytest.fixture
def azure(settings, arm, db, agent_wheel):
    arm.vms.clear()
    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": ["azure"], "PROVIDER_CONFIG": {"azure": {
        "subscription_id": "sub-1", "resource_group": "rg-train", "subnet_id": SUBNET,
        "ssh_public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEmulatorKey respawn", "endpoint": arm.endpoint,
        "credential": StaticToken(), "connection_verify": arm.cert_path, "polling_interval_s": 0.01,
        "retry_total": 0, "eviction_policy": "Deallocate"}}}
    provider_for.cache_clear()
    yield arm
    provider_for.cache_clear()


def launched_spot(**fields):
    team = make_team_with_members()
    job = make_job(team.team, team.people["member"].user, allowed_clouds=["azure"],
                   instance_types=["Standard_NC24ads_A100_v4"], **fields)
    schedule()
    instance = Instance.objects.get(job=job, state=InstanceState.REQUESTED)
    launch(instance.pk)
    instance.refresh_from_db()
    return instance


def evicted_a_while_ago(instance):
    """As if the eviction was EVICTED_FOR ago: the recorded launch and end moved back."""
    Instance.objects.filter(pk=instance.pk).update(ended_at=F("ended_at") - EVICTED_FOR)
    InstanceEvent.objects.filter(instance=instance).update(created_at=F("created_at") - 2 * EVICTED_FOR)
    instance.refresh_from_db()


def end_by(how, instance):
    if how == "reconciler":  # silent past its deadline; the cloud says stopped: an eviction
        confirm_silent(instance)
    else:  # the agent saw the eviction notice and reported its exit
        record_exit(instance, reason=ExitReason.PREEMPTED, exit_code=143, final_step=None, output_tail="",
                    last_exception="", artifact_uri="", artifact_digest="")
    instance.refresh_from_db()


@pytest.mark.parametrize("how", ["reconciler", "agent"])
def test_an_evicted_deallocated_vm_is_deleted_and_its_disk_billed_until_then(azure, how):
    instance = launched_spot()
    assert instance.stopped_disk_sku == "P10 LRS"  # recorded at launch: this VM would keep its disk
    cloud = provider_for("azure")
    azure.evict(instance.provider_instance_id)
    assert cloud.describe(instance.provider_instance_id).state == CloudState.STOPPED

    end_by(how, instance)
    assert (instance.state, instance.end_reason) == (InstanceState.ENDED, EndReason.PREEMPTED)
    evicted_a_while_ago(instance)
    open_cost = costs.job_cost(instance.job_id)
    assert open_cost.ledger.waste.stopped_disk > 0, "billed up to now while the VM stays"
    assert costs.settled_keys([instance.job_id])[instance.job_id] is None, "its money still grows"

    assert release_stopped_disks() == 0  # still there: deleted now, looked at again next period
    assert cloud.describe(instance.provider_instance_id).state == CloudState.GONE
    assert azure.requests_to("DELETE", f"/virtualMachines/{instance.provider_instance_id}")
    assert release_stopped_disks() == 1
    instance.refresh_from_db()
    assert instance.storage_released_at >= instance.ended_at + EVICTED_FOR
    assert release_stopped_disks() == 0, "released once"

    cost = costs.job_cost(instance.job_id)
    seconds = int(instance.storage_released_at.timestamp()) - int(instance.ended_at.timestamp())
    price = DiskPriceQuote.objects.get(provider="azure", region=instance.region, sku="P10 LRS").usd_per_month
    expected = (price * seconds / (HOURS_PER_MONTH * 3600)).quantize(MONEY_QUANTUM)
    assert cost.ledger.waste.stopped_disk == expected
    [row] = cost.ledger.instances
    assert row.stopped_disk_seconds == seconds
    assert cost.ledger.spent == row.spent and row.spent > expected, "the VM's hours and its disk's"
    assert costs.settled_keys([instance.job_id])[instance.job_id] is not None, "released: the figure is settled"


def test_an_evicted_vm_the_cloud_already_deleted_keeps_no_disk(azure):
    instance = launched_spot()
    provider_for("azure").terminate(instance.provider_instance_id)  # gone before anyone looked

    end_by("reconciler", instance)

    assert instance.end_reason == EndReason.PREEMPTED and instance.storage_released_at == instance.ended_at
    assert costs.job_cost(instance.job_id).ledger.waste.stopped_disk == Decimal(0)
    assert release_stopped_disks() == 0


def test_an_on_demand_vm_keeps_no_stopped_disk(azure):
    instance = launched_spot(on_demand_after_preemptions=0, preemptions=1)
    assert instance.market == "on_demand" and instance.stopped_disk_sku == ""
