"""VMs launch with the cloud identity the provider settings name (issue 17 item 4): an
AWS instance profile, a GCP service account and its scopes, an Azure user-assigned
managed identity, so the storage SDKs on the VM find credentials by their default
chain and no key sits in a job's env. Asserted in the launch bodies the emulators
received; without the setting, no identity is sent."""

from __future__ import annotations

import boto3
import pytest
from google.auth.credentials import AnonymousCredentials

from respawn_server.jobs.fleet.providers.aws import AwsConfig, AwsProvider
from respawn_server.jobs.fleet.providers.gcp import GcpConfig, GcpProvider
from tests.providers.test_aws import CREDS, REGION, aws_request
from tests.providers.test_aws import ami, aws, ec2  # noqa: F401  (fixtures)
from tests.providers.test_azure import arm, azure_provider, azure_request  # noqa: F401  (arm: a fixture)
from tests.providers.test_gcp import PROJECT, gce, gcp_request  # noqa: F401  (gce: a fixture)

IDENTITY = "/subscriptions/sub-1/resourceGroups/rg-id/providers/Microsoft.ManagedIdentity/userAssignedIdentities/train"
CLIENT_ID = "6f0d3c1e-2b7a-4d8e-9f10-1a2b3c4d5e6f"


def test_an_aws_vm_launches_with_the_configured_instance_profile(moto, ec2, ami):  # noqa: F811
    iam = boto3.client("iam", region_name=REGION, endpoint_url=moto.url, aws_access_key_id="testing",
                       aws_secret_access_key="testing")
    profile = iam.create_instance_profile(InstanceProfileName="respawn-vm")["InstanceProfile"]
    for named in ("respawn-vm", profile["Arn"]):
        aws = AwsProvider(AwsConfig(region=REGION, endpoint_url=moto.url, credentials=CREDS, image=ami,  # noqa: F811
                                    max_attempts=1, instance_profile=named))
        vm_id = aws.launch(aws_request(instance_id=11 if named == "respawn-vm" else 12))
        sent = moto.calls("RunInstances")[-1]
        key = "IamInstanceProfile.Arn" if named.startswith("arn:") else "IamInstanceProfile.Name"
        assert sent[key] == named
        described = ec2.describe_instances(InstanceIds=[vm_id])["Reservations"][0]["Instances"][0]
        assert described["IamInstanceProfile"]["Arn"] == profile["Arn"]


def test_an_aws_vm_without_a_profile_gets_none(aws, moto):  # noqa: F811
    aws.launch(aws_request())
    assert not any(key.startswith("IamInstanceProfile") for key in moto.calls("RunInstances")[-1])


def gcp_provider(gce, **overrides):  # noqa: F811
    return GcpProvider(GcpConfig(project=PROJECT, api_endpoint=gce.endpoint, credentials=AnonymousCredentials(),
                                 poll_interval_s=0, **overrides))


def test_a_gcp_vm_runs_as_the_configured_service_account_with_its_scopes(gce):  # noqa: F811
    account = "respawn-vm@respawn-test.iam.gserviceaccount.com"
    scopes = ["https://www.googleapis.com/auth/devstorage.read_write"]
    gcp_provider(gce, service_account=account, scopes=scopes).launch(gcp_request())
    [(_, body)] = gce.insert_bodies()
    assert body["serviceAccounts"] == [{"email": account, "scopes": scopes}]


def test_a_gcp_vm_gets_the_cloud_platform_scope_by_default_and_no_account_unless_named(gce):  # noqa: F811
    account = "respawn-vm@respawn-test.iam.gserviceaccount.com"
    gcp_provider(gce, service_account=account).launch(gcp_request(instance_id=11))
    gcp_provider(gce).launch(gcp_request(instance_id=12))
    (_, named), (_, unnamed) = gce.insert_bodies()
    assert named["serviceAccounts"][0]["scopes"] == ["https://www.googleapis.com/auth/cloud-platform"]
    assert "serviceAccounts" not in unnamed


def test_a_gcp_service_account_must_be_an_email():
    with pytest.raises(ValueError, match="service_account"):
        GcpConfig(project=PROJECT, service_account="respawn-vm")


def test_an_azure_vm_launches_with_the_user_assigned_identity_and_the_agent_is_told_its_client_id(arm):  # noqa: F811
    azure = azure_provider(arm, managed_identity=IDENTITY, managed_identity_client_id=CLIENT_ID,
                           storage_account_url="https://respawnckpt.blob.core.windows.net")
    azure.launch(azure_request())
    [(_, body)] = arm.create_bodies()
    assert body["identity"] == {"type": "UserAssigned", "userAssignedIdentities": {IDENTITY: {}}}
    # What DefaultAzureCredential on the VM needs to take that identity, and where the blobs are.
    assert azure.agent_environment() == {"AZURE_CLIENT_ID": CLIENT_ID,
                                         "AZURE_STORAGE_ACCOUNT_URL": "https://respawnckpt.blob.core.windows.net"}


def test_an_azure_vm_without_an_identity_gets_none(arm):  # noqa: F811
    azure = azure_provider(arm)
    azure.launch(azure_request())
    assert "identity" not in arm.create_bodies()[0][1]
    assert azure.agent_environment() == {}


@pytest.mark.parametrize("overrides, field", [
    ({"managed_identity": "train", "managed_identity_client_id": CLIENT_ID}, "managed_identity must"),
    ({"managed_identity": IDENTITY}, "go together"),
])
def test_an_azure_identity_is_refused_unless_complete(arm, overrides, field):  # noqa: F811
    with pytest.raises(ValueError, match=field):
        azure_provider(arm, **overrides)
