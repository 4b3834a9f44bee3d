"""The promise on each cloud, end to end: a job placed on AWS (moto), GCP or Azure
(our emulators) is launched through the real SDK, its VM boots from the user data
the provider sent (played here by tests/e2e/cloud_vm.py), a real agent registers
and trains, the cloud interrupts the VM, the control plane sees it and launches a
replacement, whose real agent resumes from the right checkpoint; the job ends with
the weights of a run never interrupted.

Real processes: gunicorn, a Celery worker and beat on PostgreSQL + Redis, and per
VM its boot script, the agent and the trainer."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
import requests

from jobs.choices import EndReason, JobStatus
from jobs.models import Checkpoint, Instance, InterruptionEvent, Job, MetricPoint
from tests.conftest import ROOT, ChildProcess, wait_until
from tests.e2e.cloud_vm import ArmCloud, ComputeCloud, Ec2Cloud, VmPlayer
from tests.emulators.azure_compute import AzureComputeEmulator, ManagedIdentityEndpoint
from tests.emulators.gcp_compute import GcpComputeEmulator
from tests.factories import make_job, make_team_with_members
from tests.providers.conftest import moto_url  # noqa: F401  (a fixture: the session's moto server)

STEPS, STEP_DELAY_S = 240, 0.02
TRAIN = [sys.executable, "-m", "agents.examples.tiny", "--steps", str(STEPS)]
NOTICE_DEADLINE_S = 10.0
NOTICE_SOURCE = {"aws": "aws_imds", "gcp": "gcp_metadata", "azure": "azure_scheduled_events"}


@pytest.fixture(scope="module")
def reference_digest(tmp_path_factory) -> str:
    """The exported weights of the same training, never interrupted."""
    uri = tmp_path_factory.mktemp("reference") / "ckpt"
    subprocess.run([*TRAIN, "--uri", str(uri)], cwd=ROOT, check=True, capture_output=True, timeout=300)
    exported = uri / "export" / f"step-{STEPS:08d}" / "model.safetensors"
    return "sha256:" + hashlib.sha256(exported.read_bytes()).hexdigest()


class EmulatedCloud:
    """One cloud as the control plane's worker sees it (provider config and
    environment) and as the VM player reads it."""

    def __init__(self, cloud, region: str, instance_type: str, config: dict, env: dict[str, str] | None = None):
        self.cloud, self.region, self.instance_type = cloud, region, instance_type
        self.config, self.env = config, env or {}
        self.name = cloud.name


@pytest.fixture
def aws_cloud(moto_url):  # noqa: F811
    requests.post(f"{moto_url}/moto-api/reset", timeout=60).raise_for_status()
    ec2 = boto3.session.Session().client("ec2", region_name="us-east-1", endpoint_url=moto_url,
                                         aws_access_key_id="testing", aws_secret_access_key="testing")
    ami = ec2.describe_images(Owners=["amazon"], MaxResults=5)["Images"][0]["ImageId"]
    # Credentials reach the worker through boto3's own chain (the environment), as on a host.
    yield EmulatedCloud(Ec2Cloud(ec2), "us-east-1", "g5.xlarge", {"endpoint_url": moto_url, "image": ami, "max_attempts": 1},
                        {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"})


@pytest.fixture
def gcp_cloud():
    with GcpComputeEmulator() as gce:
        yield EmulatedCloud(ComputeCloud(gce), "us-central1", "g2-standard-4", {
            "project": "respawn-test", "api_endpoint": gce.endpoint, "credentials": "anonymous", "poll_interval_s": 0})


@pytest.fixture
def azure_cloud():
    # The worker's DefaultAzureCredential finds a managed identity by its environment, as on an Azure host.
    with AzureComputeEmulator() as arm, ManagedIdentityEndpoint() as identity:
        yield EmulatedCloud(ArmCloud(arm), "eastus", "Standard_NC24ads_A100_v4", {
            "subscription_id": "sub-1", "resource_group": "rg-train",
            "subnet_id": "/subscriptions/sub-1/resourceGroups/rg-net/providers/Microsoft.Network/virtualNetworks/v/subnets/s",
            "ssh_public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEmulatorKey respawn",
            "endpoint": arm.endpoint, "connection_verify": arm.cert_path, "polling_interval_s": 0.05, "retry_total": 0,
        }, identity.env)


@pytest.fixture(params=["aws", "gcp", "azure"])
def cloud(request) -> EmulatedCloud:
    return request.getfixturevalue(f"{request.param}_cloud")


@pytest.fixture
def control_plane(cloud, child_env, web_server, tmp_path):
    """A worker and beat that launch on `cloud`, and the player of its VMs."""
    env = {**child_env, **cloud.env, "RESPAWN_API_URL": web_server.url, "RESPAWN_PROVIDERS": cloud.name,
           "RESPAWN_PROVIDER_CONFIG": json.dumps({cloud.name: cloud.config})}
    celery = [sys.executable, "-m", "celery", "-A", "controlplane"]
    worker = ChildProcess([*celery, "worker", "--pool", "threads", "--concurrency", "4", "--loglevel", "INFO",
                           "--without-heartbeat", "--without-gossip", "--without-mingle"], env,
                          tmp_path / "worker.log").start()
    beat = ChildProcess([*celery, "beat", "--loglevel", "INFO", "-s", str(tmp_path / "beat")], env,
                        tmp_path / "beat.log").start()
    try:
        with VmPlayer(cloud.cloud, tmp_path / "vms") as player:
            yield player, worker
    finally:
        beat.stop()
        worker.stop()


def cloud_job(cloud: EmulatedCloud, tmp_path: Path) -> Job:
    setup = make_team_with_members()
    return make_job(setup.team, setup.people["member"].user, command=[*TRAIN, "--step-delay", str(STEP_DELAY_S)],
                    total_steps=STEPS, checkpoint_uri=str(tmp_path / "bucket"), checkpoint_interval_s=0.5,
                    allowed_clouds=[cloud.name], allowed_regions=[cloud.region], instance_types=[cloud.instance_type])


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_a_vm_reclaimed_after_a_notice_is_replaced_and_resumes_from_the_notice_checkpoint(
        cloud, control_plane, tmp_path, reference_digest):
    player, worker = control_plane
    job = cloud_job(cloud, tmp_path)

    def wait(predicate, what: str, timeout: float) -> None:
        try:
            wait_until(predicate, timeout=timeout, what=what, proc=worker, interval=0.1)
        except AssertionError as exc:
            job.refresh_from_db()
            instances = [(i.pk, i.provider_instance_id, i.state, i.end_reason) for i in Instance.objects.filter(job=job)]
            raise AssertionError(f"{exc}\njob: {job.status} ({job.status_reason}); instances: {instances}\n"
                                 f"{player.story()}") from None

    wait(lambda: player.booted(1), "the first VM to boot", 60)
    first = player.vms[0]
    wait(lambda: Checkpoint.objects.filter(job=job, step__gte=STEPS // 4).exists(),
         "the first VM's agent to commit a checkpoint", 60)

    first.notice(deadline_in_s=NOTICE_DEADLINE_S)
    first_instance = Instance.objects.get(job=job, provider_instance_id=first.vm.provider_instance_id)
    wait(lambda: Instance.objects.get(pk=first_instance.pk).end_reason, "the noticed instance to end",
         NOTICE_DEADLINE_S * 2)
    player.reclaim(first)  # the deadline: the cloud takes the VM back

    wait(lambda: Job.objects.get(pk=job.pk).status in JobStatus.TERMINAL, "the job to finish", 90)
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, (job.status, job.status_reason, job.failure_message, player.story())
    first_instance.refresh_from_db()
    assert first_instance.end_reason == EndReason.PREEMPTED and job.preemptions == 1
    notice = InterruptionEvent.objects.get(instance=first_instance, kind="notice")
    assert notice.source == NOTICE_SOURCE[cloud.name] and notice.checkpoint_saved
    saved = Checkpoint.objects.get(instance=first_instance, kind="notice")

    # The replacement ran on the second VM, from the checkpoint its notice saved.
    assert len(player.vms) == 2
    second = Instance.objects.get(job=job, provider_instance_id=player.vms[1].vm.provider_instance_id)
    assert second.end_reason == EndReason.COMPLETED
    assert second.resume_checkpoint == saved
    steps = MetricPoint.objects.filter(instance=second, step__gt=0).values_list("step", flat=True)
    assert steps and min(steps) > saved.step, (saved.step, sorted(steps)[:5])
    assert job.artifact_digest == reference_digest
