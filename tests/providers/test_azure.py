"""AzureProvider with the real azure-mgmt-compute client against the HTTPS ARM emulator."""

from __future__ import annotations

import base64
import dataclasses
import time

import pytest
from azure.core.credentials import AccessToken

from respawn_server.jobs.core.choices import Market
from respawn_server.jobs.fleet.providers.azure import AzureConfig, AzureProvider
from respawn_server.jobs.fleet.providers.base import TAG_INSTANCE, TAG_JOB, CapacityError, CloudState, PrecheckError, TransientError
from tests.emulators.azure_compute import AzureComputeEmulator
from tests.providers.helpers import USER_DATA, make_request

SUBNET = "/subscriptions/sub-1/resourceGroups/rg-net/providers/Microsoft.Network/virtualNetworks/vnet/subnets/default"


class StaticToken:
    """The smallest credential the SDK's bearer policy accepts."""

    def get_token(self, *scopes, **kwargs):
        return AccessToken("emulator-token", int(time.time()) + 3600)


@pytest.fixture
def arm():
    with AzureComputeEmulator() as emulator:
        yield emulator


def azure_provider(arm, **overrides):
    config = AzureConfig(
        subscription_id="sub-1",
        resource_group="rg-train",
        subnet_id=SUBNET,
        ssh_public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEmulatorKey respawn",
        endpoint=arm.endpoint,
        credential=StaticToken(),
        connection_verify=arm.cert_path,
        polling_interval_s=0.01,
        retry_total=0,
        **overrides,
    )
    return AzureProvider(config)


@pytest.fixture
def azure(arm):
    return azure_provider(arm)


def azure_request(market=Market.SPOT, instance_id=11, **kw):
    return make_request(provider="azure", region="eastus", zone="2", instance_type="Standard_NC4as_T4_v3", market=market, instance_id=instance_id, **kw)


def test_it_creates_a_spot_vm_with_eviction_policy_max_price_custom_data_and_tags(azure, arm):
    name = azure.launch(azure_request(max_price_per_hour=0.35, extra_tags={"team": "ml"}))

    [(query, body)] = arm.create_bodies()
    props = body["properties"]
    assert (props["priority"], props["evictionPolicy"], props["billingProfile"]["maxPrice"]) == ("Spot", "Delete", 0.35)
    assert base64.b64decode(props["osProfile"]["customData"]).decode() == USER_DATA == arm.custom_data(name)
    assert body["tags"] == {TAG_JOB: "7", TAG_INSTANCE: "11", "team": "ml"}
    assert (body["location"], body["zones"], props["hardwareProfile"]["vmSize"]) == ("eastus", ["2"], "Standard_NC4as_T4_v3")
    assert query["api-version"]
    # The create's long-running operation was polled to Succeeded before launch returned.
    assert azure.describe(name).state == CloudState.RUNNING
    assert not azure.bills_storage_when_stopped and azure.stopped_storage_sku == ""
    # The OS disk is the configured tier (P10: a 128 GiB Premium SSD), deleted with the VM.
    assert props["storageProfile"]["osDisk"] == {"createOption": "FromImage", "deleteOption": "Delete",
                                                 "diskSizeGB": 128, "managedDisk": {"storageAccountType": "Premium_LRS"}}


def test_it_sends_max_price_minus_one_when_none_is_set(azure, arm):
    azure.launch(azure_request())

    assert arm.create_bodies()[0][1]["properties"]["billingProfile"] == {"maxPrice": -1}


def test_it_creates_on_demand_as_regular_priority_without_eviction(azure, arm):
    azure.launch(azure_request(market=Market.ON_DEMAND))

    props = arm.create_bodies()[0][1]["properties"]
    assert props["priority"] == "Regular"
    assert "evictionPolicy" not in props and "billingProfile" not in props


def test_it_never_makes_a_second_vm_for_the_same_instance(azure, arm):
    first = azure.launch(azure_request())
    again = azure.launch(azure_request())

    assert first == again
    assert list(arm.vms) == ["respawn-11"]
    assert len(arm.create_bodies()) == 1


def test_it_terminates_idempotently(azure, arm):
    name = azure.launch(azure_request())

    azure.terminate(name)
    azure.terminate(name)

    assert azure.describe(name).state == CloudState.GONE


def test_it_sees_an_evicted_vm_as_gone_with_the_delete_policy(azure, arm):
    name = azure.launch(azure_request())
    arm.evict(name)

    assert azure.describe(name).state == CloudState.GONE
    assert azure.list_ours() == []


def test_it_sees_a_deallocated_vm_as_stopped_and_starts_it_again_instead_of_recreating(arm):
    azure = azure_provider(arm, eviction_policy="Deallocate")
    name = azure.launch(azure_request())
    arm.evict(name)

    assert azure.describe(name).state == CloudState.STOPPED
    assert [vm.state for vm in azure.list_ours()] == [CloudState.STOPPED]
    assert azure.bills_storage_when_stopped and azure.stopped_storage_sku == "P10 LRS"

    assert azure.launch(azure_request()) == name
    assert azure.describe(name).state == CloudState.RUNNING
    assert len(arm.create_bodies()) == 1
    assert arm.requests_to("POST", f"/virtualMachines/{name}/start")
    assert arm.create_bodies()[0][1]["properties"]["evictionPolicy"] == "Deallocate"


def test_the_os_disk_tier_is_configurable_and_priced_by_its_lrs_meter(arm):
    azure = azure_provider(arm, eviction_policy="Deallocate", os_disk_tier="E20")
    azure.launch(azure_request())

    os_disk = arm.create_bodies()[0][1]["properties"]["storageProfile"]["osDisk"]
    assert (os_disk["diskSizeGB"], os_disk["managedDisk"]) == (512, {"storageAccountType": "StandardSSD_LRS"})
    assert azure.stopped_storage_sku == "E20 LRS"


def test_an_unknown_os_disk_tier_is_refused_naming_the_field(arm):
    with pytest.raises(ValueError, match="AzureConfig.os_disk_tier must be one of P4, .* got 'P11'"):
        azure_provider(arm, os_disk_tier="P11")


def test_it_lists_only_tagged_vms(azure, arm):
    azure.launch(azure_request(instance_id=1))
    azure.launch(azure_request(instance_id=2))
    arm.vms["someone-elses"] = {"name": "someone-elses", "tags": {"owner": "bob"}, "properties": {}}

    listed = azure.list_ours()

    assert sorted((vm.provider_instance_id, vm.job_id, vm.instance_id, vm.state, vm.zone) for vm in listed) == [
        ("respawn-1", 7, 1, CloudState.RUNNING, "2"),
        ("respawn-2", 7, 2, CloudState.RUNNING, "2"),
    ]


@pytest.mark.parametrize(
    "code",
    [
        "AllocationFailed",
        "ZonalAllocationFailed",
        "OverconstrainedAllocationRequest",
        "OverconstrainedZonalAllocationRequest",
        "SkuNotAvailable",
    ],
)
def test_it_reports_an_allocation_failure_as_capacity_and_leaves_nothing_behind(azure, arm, code):
    arm.fail_next_create(code, message=f"Allocation failed ({code}). Please try another size or region.")

    with pytest.raises(CapacityError, match="try another size") as caught:
        azure.launch(azure_request())

    assert caught.value.code == code
    assert arm.requests_to("DELETE", "/virtualMachines/respawn-11")  # the Failed VM ARM kept is removed


@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [
        (409, "SkuNotAvailable", CapacityError),
        (409, "QuotaExceeded", PrecheckError),
        (409, "OperationNotAllowed", PrecheckError),
        (403, "AuthorizationFailed", PrecheckError),
        (401, "InvalidAuthenticationToken", PrecheckError),
        (400, "InvalidParameter", PrecheckError),
        (404, "PlatformImageNotFound", PrecheckError),
        (404, "ImageNotFound", PrecheckError),
        (409, "SubscriptionNotRegistered", PrecheckError),
        (429, "TooManyRequests", TransientError),
        (500, "InternalServerError", TransientError),
        (500, "InternalExecutionError", TransientError),
        (503, "SomethingNew", TransientError),
    ],
)
def test_it_classifies_errors_answered_on_the_create_itself(azure, arm, status, code, kind):
    arm.fail_next_create(code, http_status=status, at_request=True, message=f"ARM says {code}")

    with pytest.raises(kind, match=f"ARM says {code}") as caught:
        azure.launch(azure_request())

    assert type(caught.value) is kind
    assert caught.value.code == code


def test_it_reports_quota_in_the_operation_as_a_precheck_with_the_clouds_message(azure, arm):
    arm.fail_next_create("OperationNotAllowed", message="Operation could not be completed as it results in exceeding approved LowPriorityCores quota.")

    with pytest.raises(PrecheckError, match="LowPriorityCores quota"):
        azure.launch(azure_request())


def test_it_reports_an_unreachable_endpoint_as_transient(arm):
    provider = AzureProvider(dataclasses.replace(azure_provider(arm).config, endpoint="https://127.0.0.1:9"))
    with pytest.raises(TransientError, match="unreachable"):
        provider.describe("respawn-1")


def test_it_validates_its_config(arm):
    with pytest.raises(ValueError, match="eviction_policy"):
        azure_provider(arm, eviction_policy="Stop")
    with pytest.raises(ValueError, match="image"):
        azure_provider(arm, image="ubuntu")
    with pytest.raises(ValueError, match="subnet_id"):
        AzureConfig(subscription_id="s", resource_group="rg", subnet_id="", ssh_public_key="k")


def test_it_reports_a_refused_credential_as_a_precheck(arm):
    from azure.core.exceptions import ClientAuthenticationError

    class ExpiredSecret:
        def get_token(self, *scopes, **kwargs):
            raise ClientAuthenticationError("AADSTS7000222: the client secret keys are expired")

    provider = AzureProvider(dataclasses.replace(azure_provider(arm).config, credential=ExpiredSecret()))
    with pytest.raises(PrecheckError, match="AADSTS7000222"):
        provider.launch(azure_request())
    assert arm.vms == {}
