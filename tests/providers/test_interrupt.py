"""Provider.interrupt, the drill's cloud call, with each cloud's real SDK against our
emulators: AWS FIS (an emulator in front of nothing moto has), GCP's simulated
maintenance event, Azure's simulated eviction; and a missing permission refusing the
drill with the permission named."""

from __future__ import annotations

import boto3
import pytest
from google.auth.credentials import AnonymousCredentials

from respawn_server.jobs.core.choices import Market
from respawn_server.jobs.fleet.providers.aws import AwsConfig, AwsProvider
from respawn_server.jobs.fleet.providers.base import CloudState, DrillUnsupported, MissingPermission
from respawn_server.jobs.fleet.providers.gcp import GcpConfig, GcpProvider
from tests.emulators.azure_compute import AzureComputeEmulator
from tests.emulators.fis import FisEmulator
from tests.emulators.gcp_compute import GcpComputeEmulator
from tests.providers.helpers import make_request
from tests.providers.test_aws import CREDS, REGION
from tests.providers.test_azure import azure_provider, azure_request

ROLE = "arn:aws:iam::123456789012:role/respawn-fis"


@pytest.fixture
def ec2(moto):
    return boto3.client("ec2", region_name=REGION, endpoint_url=moto.url, aws_access_key_id="testing",
                        aws_secret_access_key="testing")


@pytest.fixture
def fis(ec2):
    with FisEmulator(ec2=ec2) as emulator:
        yield emulator


@pytest.fixture
def aws_vm(moto, ec2, fis):
    image = ec2.describe_images(Owners=["amazon"], MaxResults=5)["Images"][0]["ImageId"]

    def make(**config):
        provider = AwsProvider(AwsConfig(region=REGION, endpoint_url=moto.url, credentials=CREDS, image=image,
                                         max_attempts=1, fis_endpoint_url=fis.endpoint, **config))
        vm_id = provider.launch(make_request(provider="aws", region=REGION, zone="us-east-1b",
                                             instance_type="t3.micro", market=Market.SPOT))
        return provider, vm_id
    return make


def test_aws_sends_a_spot_interruption_through_fis_naming_only_that_instance(aws_vm, fis, ec2):
    aws, vm_id = aws_vm(fis_role_arn=ROLE)

    answer = aws.interrupt(vm_id, with_notice=True)

    [template] = fis.templates.values()
    [action] = template["actions"].values()
    assert action["actionId"] == "aws:ec2:send-spot-instance-interruptions"
    assert action["parameters"] == {"durationBeforeInterruption": "PT2M"}
    [target] = template["targets"].values()
    assert target["resourceType"] == "aws:ec2:spot-instance" and target["selectionMode"] == "ALL"
    assert target["resourceArns"] == [f"arn:aws:ec2:{REGION}:123456789012:instance/{vm_id}"]
    assert template["roleArn"] == ROLE and template["stopConditions"] == [{"source": "none"}]
    assert fis.experiments and fis.experiments[0]["id"] in answer
    assert aws.describe(vm_id).state == CloudState.GONE  # the interruption reached the instance


def test_aws_without_notice_terminates_through_fis(aws_vm, fis):
    aws, vm_id = aws_vm(fis_role_arn=ROLE)
    aws.interrupt(vm_id, with_notice=False)
    assert fis.interrupted == [("aws:ec2:terminate-instances", vm_id)]


@pytest.mark.parametrize("operation", ["CreateExperimentTemplate", "StartExperiment"])
def test_aws_refuses_the_drill_naming_the_missing_fis_permission(aws_vm, fis, operation):
    aws, vm_id = aws_vm(fis_role_arn=ROLE)
    fis.deny(operation)
    with pytest.raises(MissingPermission) as refused:
        aws.interrupt(vm_id, with_notice=True)
    assert refused.value.permission == f"fis:{operation}"
    assert aws.describe(vm_id).state == CloudState.RUNNING


def test_aws_without_a_fis_role_says_which_setting_is_missing(aws_vm):
    aws, vm_id = aws_vm()
    with pytest.raises(DrillUnsupported, match="fis_role_arn"):
        aws.interrupt(vm_id, with_notice=True)


@pytest.fixture
def gce():
    with GcpComputeEmulator() as emulator:
        yield emulator


@pytest.fixture
def gcp(gce):
    return GcpProvider(GcpConfig(project="respawn-test", api_endpoint=gce.endpoint,
                                 credentials=AnonymousCredentials(), poll_interval_s=0))


def gcp_vm(gcp):
    return gcp.launch(make_request(provider="gcp", region="us-central1", zone="us-central1-a",
                                   instance_type="g2-standard-4", market=Market.SPOT))


def test_gcp_simulates_a_maintenance_event_which_preempts_the_spot_vm(gcp, gce):
    vm_id = gcp_vm(gcp)
    gcp.interrupt(vm_id, with_notice=True)
    assert gce.maintenance_events == [("us-central1-a", "respawn-11")]
    assert gce.preempted == [("us-central1-a", "respawn-11")]
    assert gcp.describe(vm_id).state == CloudState.GONE


def test_gcp_without_notice_deletes_the_vm(gcp, gce):
    vm_id = gcp_vm(gcp)
    gcp.interrupt(vm_id, with_notice=False)
    assert not gce.maintenance_events and gcp.describe(vm_id).state == CloudState.GONE


def test_gcp_refuses_the_drill_naming_the_missing_permission(gcp, gce):
    vm_id = gcp_vm(gcp)
    gce.deny("compute.instances.simulateMaintenanceEvent")
    with pytest.raises(MissingPermission) as refused:
        gcp.interrupt(vm_id, with_notice=True)
    assert refused.value.permission == "compute.instances.simulateMaintenanceEvent"
    assert gcp.describe(vm_id).state == CloudState.RUNNING


@pytest.fixture
def arm():
    with AzureComputeEmulator() as emulator:
        yield emulator


def test_azure_simulates_the_eviction_of_the_spot_vm(arm):
    azure = azure_provider(arm)
    name = azure.launch(azure_request())
    assert azure.interrupt(name, with_notice=True) == "simulateEviction"
    assert arm.evicted == [name]
    assert azure.describe(name).state == CloudState.GONE


def test_azure_without_notice_force_deletes(arm):
    azure = azure_provider(arm)
    name = azure.launch(azure_request())
    azure.interrupt(name, with_notice=False)
    assert arm.deletes[-1][0] == name and arm.deletes[-1][1].get("forceDeletion") == "true"


def test_azure_refuses_the_drill_naming_the_missing_permission(arm):
    azure = azure_provider(arm)
    name = azure.launch(azure_request())
    arm.deny("Microsoft.Compute/virtualMachines/simulateEviction/action")
    with pytest.raises(MissingPermission) as refused:
        azure.interrupt(name, with_notice=True)
    assert refused.value.permission == "Microsoft.Compute/virtualMachines/simulateEviction/action"
    assert not arm.evicted
