"""AWS EC2 through boto3: one provider object serves one region.

Idempotency rests on two things: the request's client token as `ClientToken`
(what real EC2 honours) and a lookup by our `respawn:instance` tag before every
launch (what makes a repeated call safe where the token is not honoured, e.g.
moto, or after the token's own window has passed).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError, HTTPClientError, NoCredentialsError
from botocore.exceptions import ConnectionError as BotoConnectionError

from respawn_server.jobs.core.choices import Market
from respawn_server.jobs.fleet.providers.base import (TAG_INSTANCE, TAG_JOB, CloudInstance, CloudState, DrillUnsupported,
                                       LaunchRequest, PrecheckError, Provider, TransientError)
from respawn_server.jobs.fleet.providers.errors import ErrorCodes, naming_permission
from respawn_server.jobs.fleet.providers.tags import ids_from_tags

ERROR_CODES = ErrorCodes(
    transient=frozenset(
        {"RequestLimitExceeded", "Throttling", "ThrottlingException", "InternalError", "ServiceUnavailable", "Unavailable"}
    ),
    capacity=frozenset(
        {
            "InsufficientInstanceCapacity",
            "InsufficientCapacity",
            "InsufficientHostCapacity",
            "InsufficientReservedInstanceCapacity",
            "SpotMaxPriceTooLow",
        }
    ),
    # "Unsupported": this type or market is not offered in this zone; another zone may have it.
    capacity_prefixes=("Unsupported",),
    precheck=frozenset(
        {
            "UnauthorizedOperation",
            "AuthFailure",
            "InvalidParameterValue",
            "InvalidParameterCombination",
            "OptInRequired",
            "MaxSpotInstanceCountExceeded",  # the account's spot limit: a quota
        }
    ),
    precheck_prefixes=("InvalidAMIID.", "InvalidInstanceType", "InvalidKeyPair.", "InvalidSubnetID.", "InvalidGroup."),
    precheck_suffixes=("LimitExceeded",),  # VcpuLimitExceeded, InstanceLimitExceeded, ...
)

NOT_FOUND = "InvalidInstanceID.NotFound"
# What AWS answers a call its caller has no permission for (FIS, EC2).
ACCESS_DENIED = ("AccessDeniedException", "AccessDenied", "UnauthorizedOperation")
# A drill through FIS: with a notice, the spot interruption itself (its notice, two minutes,
# then the reclaim: FIS's shortest); without one, the instance terminated at once.
FIS_NOTICE = {"actionId": "aws:ec2:send-spot-instance-interruptions", "resourceType": "aws:ec2:spot-instance",
              "parameters": {"durationBeforeInterruption": "PT2M"}}
FIS_RECLAIM = {"actionId": "aws:ec2:terminate-instances", "resourceType": "aws:ec2:instance", "parameters": {}}
# States in which the VM still exists or bills; a launch must not add a second one.
LIVE_STATES = ("pending", "running", "stopping", "stopped")
STATE_MAP = {
    "pending": CloudState.PENDING,
    "running": CloudState.RUNNING,
    "stopping": CloudState.STOPPED,
    "stopped": CloudState.STOPPED,
    "shutting-down": CloudState.GONE,
    "terminated": CloudState.GONE,
}


@dataclass(frozen=True, kw_only=True, slots=True)
class AwsCredentials:
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class AwsConfig:
    region: str
    """The one region this provider launches in and lists (e.g. "us-east-1")."""
    endpoint_url: str | None = None
    """EC2 endpoint override, e.g. a moto server; None for the real AWS endpoint."""
    credentials: AwsCredentials | None = None
    """None: boto3's own chain (environment, profile, instance role)."""
    image: str = ""
    """Default AMI id, used when a launch request names none."""
    instance_profile: str = ""
    """IAM instance profile VMs launch with (its name, or its ARN): the role boto3 on the VM
    takes from the instance metadata service, to read and write the job's s3:// checkpoints
    with no keys in the job's env (docs/deploy.md gives the smallest policy). Empty: none."""
    max_attempts: int = 3
    """Attempts per call, the first included: botocore retries throttling and 5xx itself."""
    list_page_size: int = 500
    """Instances per DescribeInstances page when listing ours (EC2 allows 5 to 1000)."""
    fis_role_arn: str = ""
    """Drills (optional): the IAM role AWS Fault Injection Service assumes to interrupt a VM
    (ec2:SendSpotInstanceInterruptions, ec2:TerminateInstances, ec2:DescribeInstances on
    our instances); docs/deploy.md. Empty: drills are refused on AWS, naming this setting."""
    fis_endpoint_url: str | None = None
    """FIS endpoint override, e.g. an emulator; None for the real FIS endpoint."""

    def __post_init__(self) -> None:
        if not self.region:
            raise ValueError("AwsConfig.region is required, e.g. 'us-east-1'")
        if self.max_attempts < 1:
            raise ValueError(f"AwsConfig.max_attempts must be at least 1, got {self.max_attempts}")
        if not 5 <= self.list_page_size <= 1000:
            raise ValueError(f"AwsConfig.list_page_size must be within 5..1000 (EC2's limits), got {self.list_page_size}")


@contextmanager
def translated_errors() -> Iterator[None]:
    """Re-raise EC2 failures as our ProviderError kinds, keeping the cloud's message."""
    try:
        yield
    except ClientError as exc:
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        raise ERROR_CODES.classify(error.get("Code", ""), error.get("Message", str(exc)), http_status=status) from exc
    except (HTTPClientError, BotoConnectionError) as exc:
        raise TransientError(f"EC2 unreachable: {exc}") from exc
    except NoCredentialsError as exc:
        raise PrecheckError(f"no AWS credentials: {exc}", code="NoCredentials") from exc


class AwsProvider(Provider):
    name = "aws"

    def __init__(self, config: AwsConfig):
        self.config = config
        self._ec2 = self._client("ec2", config.endpoint_url)
        self._fis = self._client("fis", config.fis_endpoint_url)  # drills only

    def _client(self, service: str, endpoint_url: str | None):
        creds = self.config.credentials
        # A session of its own: boto3's module-level default session caches the
        # credentials it first found and is not safe to share between worker threads.
        return boto3.session.Session().client(
            service,
            region_name=self.config.region,
            endpoint_url=endpoint_url,
            aws_access_key_id=creds.access_key_id if creds else None,
            aws_secret_access_key=creds.secret_access_key if creds else None,
            aws_session_token=creds.session_token if creds else None,
            config=Config(retries={"mode": "standard", "total_max_attempts": self.config.max_attempts}),
        )

    def launch(self, request: LaunchRequest) -> str:
        placement = request.placement
        if placement.region != self.config.region:
            raise ValueError(f"placement region {placement.region!r} is not this provider's region {self.config.region!r}")
        image = request.machine_image or self.config.image
        if not image:
            raise PrecheckError("no AMI to launch: set the job's `machine_image: {aws: ami-…}` or the AWS config's `image`")
        existing = self.find_by_instance_id(request.instance_id)
        if existing is not None:
            return existing.provider_instance_id
        # Ours last: an extra tag must never hide which job and instance a VM belongs to.
        tags = {**request.extra_tags, TAG_JOB: str(request.job_id), TAG_INSTANCE: str(request.instance_id)}
        params = {
            "ImageId": image,
            "InstanceType": placement.instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": request.client_token,
            "UserData": request.user_data,  # boto3 base64-encodes it
            "TagSpecifications": [
                {"ResourceType": kind, "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
                for kind in ("instance", "volume")
            ],
        }
        profile = self.config.instance_profile
        if profile:
            params["IamInstanceProfile"] = {"Arn": profile} if profile.startswith("arn:") else {"Name": profile}
        if placement.zone:  # none: EC2 picks a zone of the region
            params["Placement"] = {"AvailabilityZone": placement.zone}
        if placement.market == Market.SPOT:
            params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": self._spot_options(request)}
        with translated_errors():
            reply = self._ec2.run_instances(**params)
        return reply["Instances"][0]["InstanceId"]

    @staticmethod
    def _spot_options(request: LaunchRequest) -> dict:
        options = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
        if request.max_price_per_hour is not None:
            options["MaxPrice"] = f"{request.max_price_per_hour:.6f}"
        return options

    def terminate(self, provider_instance_id: str) -> None:
        try:
            with translated_errors():
                self._ec2.terminate_instances(InstanceIds=[provider_instance_id])
        except PrecheckError as exc:
            if exc.code != NOT_FOUND:
                raise

    def interrupt(self, provider_instance_id: str, *, with_notice: bool) -> str:
        """Through AWS Fault Injection Service: an experiment template naming this one
        instance, then the experiment started; returns the experiment's id."""
        if not self.config.fis_role_arn:
            raise DrillUnsupported("drills on AWS run through Fault Injection Service, which needs a role to assume: "
                                   "set the AWS provider's fis_role_arn (docs/deploy.md)", code="NoFisRole")
        with translated_errors():
            reply = self._ec2.describe_instances(InstanceIds=[provider_instance_id])
        owner = reply["Reservations"][0]["OwnerId"]
        arn = f"arn:aws:ec2:{self.config.region}:{owner}:instance/{provider_instance_id}"
        action = FIS_NOTICE if with_notice else FIS_RECLAIM
        template = self._fis_call("fis:CreateExperimentTemplate", self._fis.create_experiment_template,
                                  clientToken=str(uuid.uuid4()), roleArn=self.config.fis_role_arn,
                                  description=f"respawn drill of {provider_instance_id}",
                                  targets={"Instance": {"resourceType": action["resourceType"], "resourceArns": [arn],
                                                        "selectionMode": "ALL"}},
                                  actions={"interrupt": {"actionId": action["actionId"], "parameters": action["parameters"],
                                                         "targets": {"Instances": "Instance"}}},
                                  stopConditions=[{"source": "none"}], tags={"respawn:drill": provider_instance_id})
        experiment = self._fis_call("fis:StartExperiment", self._fis.start_experiment, clientToken=str(uuid.uuid4()),
                                    experimentTemplateId=template["experimentTemplate"]["id"])
        return f"FIS experiment {experiment['experiment']['id']} ({action['actionId']})"

    @staticmethod
    def _fis_call(permission: str, call, **params) -> dict:
        with naming_permission(permission, ACCESS_DENIED), translated_errors():
            return call(**params)

    def describe(self, provider_instance_id: str) -> CloudInstance:
        try:
            with translated_errors():
                reply = self._ec2.describe_instances(InstanceIds=[provider_instance_id])
        except PrecheckError as exc:
            if exc.code != NOT_FOUND:
                raise
            return CloudInstance(provider_instance_id=provider_instance_id, state=CloudState.GONE)
        found = [vm for reservation in reply["Reservations"] for vm in reservation["Instances"]]
        if not found:
            return CloudInstance(provider_instance_id=provider_instance_id, state=CloudState.GONE)
        return _cloud_instance(found[0])

    def list_ours(self) -> list[CloudInstance]:
        return list(self._list([{"Name": "tag-key", "Values": [TAG_INSTANCE]}]))

    def find_by_instance_id(self, instance_id: int) -> CloudInstance | None:
        # Asked of EC2 directly (one tag filter) rather than by listing all of ours.
        found = list(self._list([{"Name": f"tag:{TAG_INSTANCE}", "Values": [str(instance_id)]}]))
        return found[0] if found else None

    def _list(self, filters: list[dict]) -> Iterator[CloudInstance]:
        filters = [*filters, {"Name": "instance-state-name", "Values": list(LIVE_STATES)}]
        with translated_errors():
            for page in self._ec2.get_paginator("describe_instances").paginate(
                Filters=filters, PaginationConfig={"PageSize": self.config.list_page_size}
            ):
                for reservation in page["Reservations"]:
                    for vm in reservation["Instances"]:
                        yield _cloud_instance(vm)


def _cloud_instance(vm: dict) -> CloudInstance:
    tags = {tag["Key"]: tag["Value"] for tag in vm.get("Tags", [])}
    job_id, instance_id = ids_from_tags(tags, job_key=TAG_JOB, instance_key=TAG_INSTANCE)
    return CloudInstance(
        provider_instance_id=vm["InstanceId"],
        state=STATE_MAP.get(vm["State"]["Name"], CloudState.PENDING),
        zone=vm.get("Placement", {}).get("AvailabilityZone", ""),
        instance_type=vm.get("InstanceType", ""),
        job_id=job_id,
        instance_id=instance_id,
    )
