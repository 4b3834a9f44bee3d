"""GcpProvider with the real google-cloud-compute client against the Compute emulator."""

from __future__ import annotations

import uuid

import pytest
from google.auth.credentials import AnonymousCredentials

from respawn_server.jobs.core.choices import Market
from respawn_server.jobs.fleet.providers.base import (LABEL_INSTANCE, LABEL_JOB, CapacityError, CloudState, PrecheckError,
                                       TransientError)
from respawn_server.jobs.fleet.providers.gcp import GcpConfig, GcpProvider
from tests.emulators.gcp_compute import GcpComputeEmulator
from tests.providers.helpers import USER_DATA, client_token, make_request

PROJECT = "respawn-test"
ZONE = "us-central1-a"


@pytest.fixture
def gce():
    with GcpComputeEmulator() as emulator:
        yield emulator


@pytest.fixture
def gcp(gce):
    return GcpProvider(GcpConfig(project=PROJECT, api_endpoint=gce.endpoint, credentials=AnonymousCredentials(), poll_interval_s=0))


def gcp_request(market=Market.SPOT, instance_id=11, zone=ZONE, **kw):
    return make_request(provider="gcp", region="us-central1", zone=zone, instance_type="g2-standard-4", market=market, instance_id=instance_id, **kw)


def metadata(body: dict) -> dict[str, str]:
    return {item["key"]: item["value"] for item in body["metadata"]["items"]}


def test_it_inserts_a_spot_vm_deleted_on_preemption_with_labels_and_startup_script(gcp, gce):
    vm_id = gcp.launch(gcp_request(extra_tags={"team": "ml"}))

    assert vm_id == f"{ZONE}/respawn-11"
    [(query, body)] = gce.insert_bodies()
    assert query["requestId"] == client_token(11)
    assert body["scheduling"]["provisioningModel"] == "SPOT"
    assert body["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert body["labels"] == {LABEL_JOB: "7", LABEL_INSTANCE: "11", "team": "ml"}
    assert metadata(body)["startup-script"] == USER_DATA == gce.startup_script(ZONE, "respawn-11")
    assert body["machineType"] == f"zones/{ZONE}/machineTypes/g2-standard-4"
    assert gcp.describe(vm_id).state == CloudState.RUNNING  # the insert's operation was polled to DONE


def test_it_inserts_an_on_demand_vm_as_standard(gcp, gce):
    gcp.launch(gcp_request(market=Market.ON_DEMAND))

    [(_, body)] = gce.insert_bodies()
    assert body["scheduling"]["provisioningModel"] == "STANDARD"
    assert "instanceTerminationAction" not in body["scheduling"]


def test_it_never_makes_a_second_vm_for_the_same_instance(gcp, gce):
    first = gcp.launch(gcp_request())
    again = gcp.launch(gcp_request())
    retried_elsewhere = gcp.launch(gcp_request(client_token=str(uuid.uuid4())))  # a new request id: the name conflicts

    assert first == again == retried_elsewhere
    assert list(gce.instances) == [(ZONE, "respawn-11")]


def test_it_terminates_idempotently(gcp, gce):
    vm_id = gcp.launch(gcp_request())

    gcp.terminate(vm_id)
    gcp.terminate(vm_id)

    assert gce.instances == {}
    assert gcp.describe(vm_id).state == CloudState.GONE


def test_it_sees_a_preempted_vm_as_gone_and_relaunches_a_new_one(gcp, gce):
    vm_id = gcp.launch(gcp_request(instance_id=11))
    gce.preempt(ZONE, "respawn-11")

    assert gcp.describe(vm_id).state == CloudState.GONE
    assert gcp.list_ours() == []
    replacement = gcp.launch(gcp_request(instance_id=12, zone="us-central1-b"))
    assert gcp.describe(replacement).state == CloudState.RUNNING


def test_it_lists_only_labelled_vms_across_zones_and_pages(gce):
    gcp = GcpProvider(GcpConfig(project=PROJECT, api_endpoint=gce.endpoint, credentials=AnonymousCredentials(), list_page_size=2))
    for instance_id, zone in [(1, "us-central1-a"), (2, "us-central1-b"), (3, "europe-west4-a")]:
        gcp.launch(gcp_request(instance_id=instance_id, zone=zone))
    gce.instances[("us-central1-a", "someone-elses")] = {"name": "someone-elses", "status": "RUNNING", "labels": {}}

    listed = gcp.list_ours()

    assert sorted((vm.provider_instance_id, vm.job_id, vm.instance_id) for vm in listed) == [
        ("europe-west4-a/respawn-3", 7, 3),
        ("us-central1-a/respawn-1", 7, 1),
        ("us-central1-b/respawn-2", 7, 2),
    ]
    assert len(gce.requests_to("GET", "/aggregated/instances")) == 2
    assert gcp.find_by_instance_id(2).provider_instance_id == "us-central1-b/respawn-2"
    assert gcp.find_by_instance_id(99) is None


@pytest.mark.parametrize(
    "code",
    [
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "STOCKOUT",
        "resourcePoolExhausted",
        "UNSUPPORTED_OPERATION",
    ],
)
def test_it_reports_a_stockout_in_the_operation_as_a_capacity_error(gcp, gce, code):
    gce.fail_next_insert(code, http_status=503, message=f"The zone does not have enough resources ({code})")

    with pytest.raises(CapacityError, match="enough resources") as caught:
        gcp.launch(gcp_request())

    assert caught.value.code == code
    assert gce.instances == {}


def test_it_reports_quota_exceeded_in_the_operation_as_a_precheck_with_the_clouds_message(gcp, gce):
    gce.fail_next_insert("QUOTA_EXCEEDED", http_status=403, message="Quota 'GPUS_ALL_REGIONS' exceeded. Limit: 0.0 globally.")

    with pytest.raises(PrecheckError, match="GPUS_ALL_REGIONS"):
        gcp.launch(gcp_request())


@pytest.mark.parametrize(
    ("status", "reason", "kind"),
    [
        (403, "forbidden", PrecheckError),
        (403, "quotaExceeded", PrecheckError),
        (403, "accessNotConfigured", PrecheckError),
        (403, "PERMISSIONS_ERROR", PrecheckError),
        (403, "rateLimitExceeded", TransientError),  # Compute says 403 for throttling too
        (403, "userRateLimitExceeded", TransientError),
        (429, "rateLimitExceeded", TransientError),
        (503, "backendError", TransientError),
        (500, "internalError", TransientError),
        (400, "resourceNotReady", TransientError),
        (400, "invalid", PrecheckError),
        (400, "somethingNew", PrecheckError),
    ],
)
def test_it_classifies_errors_answered_on_the_insert_itself(gcp, gce, status, reason, kind):
    gce.fail_next_insert(reason, http_status=status, at_request=True)

    with pytest.raises(kind) as caught:
        gcp.launch(gcp_request())

    assert type(caught.value) is kind
    assert caught.value.code == reason


def test_it_reports_an_unreachable_endpoint_as_transient():
    provider = GcpProvider(GcpConfig(project=PROJECT, api_endpoint="http://127.0.0.1:9", credentials=AnonymousCredentials()))
    with pytest.raises(TransientError, match="unreachable"):
        provider.describe(f"{ZONE}/respawn-1")


def test_it_validates_its_config_and_ids(gcp):
    with pytest.raises(ValueError, match="project"):
        GcpConfig(project="")
    with pytest.raises(ValueError, match="name_prefix"):
        GcpConfig(project=PROJECT, name_prefix="Respawn_VMs")
    with pytest.raises(ValueError, match="<zone>/<name>"):
        gcp.describe("respawn-11")


def test_it_sends_the_client_token_as_a_request_id_compute_accepts(gcp, gce):
    # Compute refuses a request id that is not a UUID; the control plane's client tokens are UUIDs.
    with pytest.raises(PrecheckError, match="requestId"):
        gcp.launch(gcp_request(client_token="not-a-uuid"))
    with pytest.raises(ValueError, match="zone"):
        gcp.launch(gcp_request(zone=""))
