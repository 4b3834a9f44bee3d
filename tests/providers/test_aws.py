"""AwsProvider with the real boto3 client against moto's server on 127.0.0.1,
and through a fault-injecting proxy in front of it for the errors moto never makes."""

from __future__ import annotations

import base64

import boto3
import pytest

from respawn_server.jobs.core.choices import Market
from respawn_server.jobs.fleet.providers.aws import AwsConfig, AwsCredentials, AwsProvider
from respawn_server.jobs.fleet.providers.base import TAG_INSTANCE, TAG_JOB, CapacityError, CloudState, PrecheckError, TransientError
from tests.emulators.ec2_faults import Ec2FaultProxy
from tests.providers.helpers import USER_DATA, client_token, make_request

REGION = "us-east-1"
CREDS = AwsCredentials(access_key_id="testing", secret_access_key="testing")


@pytest.fixture
def ec2(moto):
    return boto3.client(
        "ec2", region_name=REGION, endpoint_url=moto.url, aws_access_key_id="testing", aws_secret_access_key="testing"
    )


@pytest.fixture(scope="session")
def ami(moto_url):
    # moto's bundled AMIs are the same after every reset: look one up once.
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=moto_url, aws_access_key_id="t", aws_secret_access_key="t")
    return ec2.describe_images(Owners=["amazon"], MaxResults=5)["Images"][0]["ImageId"]


@pytest.fixture
def aws(moto, ami):
    return AwsProvider(AwsConfig(region=REGION, endpoint_url=moto.url, credentials=CREDS, image=ami, max_attempts=1))


def aws_request(market=Market.SPOT, **kw):
    kw.setdefault("instance_type", "t3.micro")
    return make_request(provider="aws", region=REGION, zone="us-east-1b", market=market, **kw)


def vm(ec2, instance_id):
    return ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]


def test_it_launches_a_one_time_spot_vm_with_our_tags_user_data_and_token(aws, ec2, moto):
    vm_id = aws.launch(aws_request(max_price_per_hour=0.42, extra_tags={"team": "ml", TAG_JOB: "999"}))

    sent = moto.calls("RunInstances")[-1]
    assert sent["ClientToken"] == client_token(11)
    assert sent["InstanceMarketOptions.MarketType"] == "spot"
    assert sent["InstanceMarketOptions.SpotOptions.SpotInstanceType"] == "one-time"
    assert sent["InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior"] == "terminate"
    assert float(sent["InstanceMarketOptions.SpotOptions.MaxPrice"]) == 0.42
    described = vm(ec2, vm_id)
    assert described["InstanceLifecycle"] == "spot"
    assert described["Placement"]["AvailabilityZone"] == "us-east-1b"
    tags = {t["Key"]: t["Value"] for t in described["Tags"]}
    assert tags == {TAG_JOB: "7", TAG_INSTANCE: "11", "team": "ml"}
    user_data = ec2.describe_instance_attribute(InstanceId=vm_id, Attribute="userData")["UserData"]["Value"]
    assert base64.b64decode(user_data).decode() == USER_DATA


def test_it_launches_on_demand_without_market_options(aws, ec2, moto):
    vm_id = aws.launch(aws_request(market=Market.ON_DEMAND))

    assert not any(key.startswith("InstanceMarketOptions") for key in moto.calls("RunInstances")[-1])
    assert "InstanceLifecycle" not in vm(ec2, vm_id)
    assert aws.describe(vm_id).state == CloudState.RUNNING


def test_it_never_makes_a_second_vm_for_the_same_instance(aws, ec2):
    first = aws.launch(aws_request())
    again = aws.launch(aws_request())

    assert again == first
    assert [vm.provider_instance_id for vm in aws.list_ours()] == [first]


def test_it_terminates_idempotently_and_then_describes_gone(aws):
    vm_id = aws.launch(aws_request())

    aws.terminate(vm_id)
    aws.terminate(vm_id)

    assert aws.describe(vm_id).state == CloudState.GONE
    assert aws.list_ours() == []
    aws.terminate("i-0123456789abcdef0")  # never existed: still not an error


def test_it_sees_an_interruption_as_gone_and_relaunches_a_new_instance(aws, ec2):
    vm_id = aws.launch(aws_request(instance_id=11))
    ec2.terminate_instances(InstanceIds=[vm_id])  # what EC2 does on a spot interruption

    assert aws.describe(vm_id).state == CloudState.GONE
    replacement = aws.launch(aws_request(instance_id=12))
    assert replacement != vm_id
    assert aws.describe(replacement).state == CloudState.RUNNING


def test_it_describes_an_unknown_instance_as_gone(aws):
    assert aws.describe("i-0123456789abcdef0").state == CloudState.GONE


def test_it_lists_only_vms_carrying_our_tags(aws, ec2, ami):
    ours = aws.launch(aws_request(instance_id=11))
    ec2.run_instances(ImageId=ami, InstanceType="t3.micro", MinCount=1, MaxCount=1)  # someone else's VM

    listed = aws.list_ours()

    assert [(vm.provider_instance_id, vm.job_id, vm.instance_id, vm.zone) for vm in listed] == [
        (ours, 7, 11, "us-east-1b")
    ]


def test_it_pages_through_many_of_our_vms(moto, ami, ec2):
    aws = AwsProvider(AwsConfig(region=REGION, endpoint_url=moto.url, credentials=CREDS, image=ami, list_page_size=5))
    for instance_id in range(1, 13):
        aws.launch(aws_request(instance_id=instance_id))

    assert sorted(vm.instance_id for vm in aws.list_ours()) == list(range(1, 13))
    assert len(moto.calls("DescribeInstances")) > 12 + 1  # the launches' lookups, then several pages


def test_it_refuses_an_unknown_instance_type_as_a_precheck_with_the_clouds_message(aws):
    with pytest.raises(PrecheckError, match="t9.nano") as caught:
        aws.launch(aws_request(instance_type="t9.nano"))
    assert caught.value.kind == "prechecks"


def test_it_refuses_an_unknown_ami_as_a_precheck(aws):
    with pytest.raises(PrecheckError, match="ami-deadbeef") as caught:
        aws.launch(aws_request(machine_image="ami-deadbeef"))
    assert caught.value.code == "InvalidAMIID.NotFound"


def test_it_refuses_a_placement_in_another_region(aws):
    request = make_request(provider="aws", region="eu-west-1", zone="eu-west-1a", instance_type="t3.micro", market=Market.SPOT)
    with pytest.raises(ValueError, match="eu-west-1"):
        aws.launch(request)


# --- errors moto cannot produce: a proxy in front of moto answers with EC2's real error shape ---


@pytest.fixture
def faulty_ec2(moto):
    with Ec2FaultProxy(moto.url) as proxy:
        yield proxy


@pytest.fixture
def aws_behind_faults(faulty_ec2, ami):
    return AwsProvider(AwsConfig(region=REGION, endpoint_url=faulty_ec2.endpoint, credentials=CREDS, image=ami, max_attempts=1))


@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [
        (500, "InsufficientInstanceCapacity", CapacityError),  # EC2 sends this one with a 500
        (400, "SpotMaxPriceTooLow", CapacityError),
        (400, "InsufficientCapacity", CapacityError),
        (500, "InsufficientHostCapacity", CapacityError),
        (500, "InsufficientReservedInstanceCapacity", CapacityError),
        (400, "Unsupported", CapacityError),
        (400, "UnsupportedOperation", CapacityError),
        (403, "UnauthorizedOperation", PrecheckError),
        (401, "AuthFailure", PrecheckError),
        (400, "VcpuLimitExceeded", PrecheckError),
        (400, "InstanceLimitExceeded", PrecheckError),
        (400, "MaxSpotInstanceCountExceeded", PrecheckError),
        (400, "InvalidParameterValue", PrecheckError),
        (400, "InvalidParameterCombination", PrecheckError),
        (401, "OptInRequired", PrecheckError),
        (400, "InvalidKeyPair.NotFound", PrecheckError),
        (400, "InvalidSubnetID.NotFound", PrecheckError),
        (400, "InvalidGroup.NotFound", PrecheckError),
        (400, "InvalidInstanceType", PrecheckError),
        (400, "InvalidAMIID.Malformed", PrecheckError),
        (503, "RequestLimitExceeded", TransientError),  # a LimitExceeded that is throttling, not quota
        (503, "Unavailable", TransientError),
        (503, "ServiceUnavailable", TransientError),
        (400, "Throttling", TransientError),
        (500, "InternalError", TransientError),
        (502, "SomethingNew", TransientError),
        (400, "SomethingNewAndInvalid", PrecheckError),
    ],
)
def test_it_classifies_ec2_errors_from_the_wire(faulty_ec2, aws_behind_faults, status, code, kind):
    faulty_ec2.fail_run_instances(code, status=status, message=f"EC2 says {code}")

    with pytest.raises(kind) as caught:
        aws_behind_faults.launch(aws_request())

    assert type(caught.value) is kind
    assert caught.value.code == code
    assert f"EC2 says {code}" in str(caught.value)
    assert aws_behind_faults.list_ours() == []


def test_it_launches_in_another_zone_after_a_capacity_error(faulty_ec2, aws_behind_faults):
    faulty_ec2.fail_run_instances("InsufficientInstanceCapacity", status=500, zone="us-east-1a", times=None)
    in_zone_a = make_request(provider="aws", region=REGION, zone="us-east-1a", instance_type="t3.micro", market=Market.SPOT, instance_id=21)

    with pytest.raises(CapacityError, match="InsufficientInstanceCapacity"):
        aws_behind_faults.launch(in_zone_a)
    vm_id = aws_behind_faults.launch(aws_request(instance_id=22))  # the next placement, us-east-1b

    assert [(vm.provider_instance_id, vm.zone) for vm in aws_behind_faults.list_ours()] == [(vm_id, "us-east-1b")]


def test_it_lets_botocore_retry_a_throttled_call_within_max_attempts(faulty_ec2, ami):
    aws = AwsProvider(AwsConfig(region=REGION, endpoint_url=faulty_ec2.endpoint, credentials=CREDS, image=ami, max_attempts=2))
    faulty_ec2.fail_run_instances("RequestLimitExceeded", status=503, times=1)

    vm_id = aws.launch(aws_request())

    assert len(faulty_ec2.refused) == 1
    assert aws.describe(vm_id).state == CloudState.RUNNING


def test_it_reports_an_unreachable_endpoint_as_transient():
    provider = AwsProvider(AwsConfig(region=REGION, endpoint_url="http://127.0.0.1:9", credentials=CREDS, max_attempts=1))
    with pytest.raises(TransientError, match="unreachable"):
        provider.describe("i-0123456789abcdef0")


def test_it_validates_its_config():
    with pytest.raises(ValueError, match="region"):
        AwsConfig(region="")
    with pytest.raises(ValueError, match="max_attempts"):
        AwsConfig(region=REGION, max_attempts=0)
    with pytest.raises(ValueError, match="list_page_size"):
        AwsConfig(region=REGION, list_page_size=2)


def test_it_reports_missing_credentials_as_a_precheck(moto, monkeypatch, tmp_path):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    provider = AwsProvider(AwsConfig(region=REGION, endpoint_url=moto.url))

    with pytest.raises(PrecheckError, match="no AWS credentials"):
        provider.list_ours()


def test_it_lets_ec2_pick_the_zone_when_the_placement_names_none(aws, moto):
    request = make_request(provider="aws", region=REGION, zone="", instance_type="t3.micro", market=Market.SPOT)

    vm_id = aws.launch(request)

    assert not any(key.startswith("Placement") for key in moto.calls("RunInstances")[-1])
    assert aws.describe(vm_id).zone.startswith(REGION)
