"""The promise on each cloud, end to end: a job placed on AWS (moto), GCP or Azure
(our emulators) is launched through the real SDK, its VM boots from the user data
the provider sent (played here by tests/e2e/cloud_vm.py), a real agent registers
and trains, the cloud interrupts the VM, the control plane finds out and launches
a replacement, whose real agent resumes from the right checkpoint; the job ends
with the weights of a run never interrupted.

Two interruptions: a reclaim announced on the VM's metadata service (AWS IMDS,
Azure Scheduled Events), where the agent saves a notice checkpoint before the
cloud deletes the VM; and a VM that vanishes without a word (GCP here), which only
the control plane can notice: its heartbeats stop, and the cloud, asked through
its API, says gone.

Real processes: gunicorn, a Celery worker and beat on the configured database and
broker, and per VM its boot script, the agent and the trainer."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from functools import cached_property
from pathlib import Path

import boto3
import pytest
import requests

from respawn_server.jobs.core.choices import EndReason, JobStatus
from respawn_server.jobs.models import Checkpoint, Instance, InterruptionEvent, Job, MetricPoint
from tests.agent_wheel import built_dist_dir
from tests.conftest import ROOT, WebServer, start_worker_and_beat, wait_until
from tests.e2e.cloud_vm import ArmCloud, ComputeCloud, Ec2Cloud, PlayedVm, VmPlayer
from tests.emulators.azure_compute import AzureComputeEmulator, ManagedIdentityEndpoint
from tests.emulators.gcp_compute import GcpComputeEmulator
from tests.factories import make_job, make_team_with_members
from tests.providers.conftest import moto_url  # noqa: F401  (a fixture: the session's moto server)

# What a store changes here (a relaunch's locking, the liveness sweep) the local preemption,
# liveness and chaos runs show on both stores; this module's own part is each cloud's SDK path.
pytestmark = pytest.mark.store_incidental

STEPS, STEP_DELAY_S = 160, 0.02
TRAIN = [sys.executable, "-m", "respawn.examples.tiny", "--steps", str(STEPS)]
NOTICE_DEADLINE_S = 10.0
NOTICE_SOURCE = {"aws": "aws_imds", "gcp": "gcp_metadata", "azure": "azure_scheduled_events"}


class ReferenceRun:
    """The same training never interrupted, run in the background while a test sets up."""

    def __init__(self, uri: Path):
        self.uri = uri
        self.proc = subprocess.Popen([*TRAIN, "--uri", str(uri)], cwd=ROOT, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)

    @cached_property
    def digest(self) -> str:
        _, err = self.proc.communicate(timeout=300)
        assert self.proc.returncode == 0, err.decode(errors="replace")[-2000:]
        exported = self.uri / "export" / f"step-{STEPS:08d}" / "model.safetensors"
        return "sha256:" + hashlib.sha256(exported.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run = ReferenceRun(tmp_path_factory.mktemp("reference") / "ckpt")
    yield run
    if run.proc.poll() is None:
        run.proc.kill()
        run.proc.wait()


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
    yield EmulatedCloud(Ec2Cloud(ec2), "us-east-1", "g5.xlarge",
                        {"endpoint_url": moto_url, "image": ami, "max_attempts": 1},
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


@pytest.fixture
def cloud(request) -> EmulatedCloud:
    return request.getfixturevalue(f"{request.param}_cloud")


class CloudRun:
    """The control plane (web, worker, beat) launching on one emulated cloud, the
    player of that cloud's VMs, and a job of the tiny trainer placed there."""

    def __init__(self, cloud: EmulatedCloud, child_env: dict, tmp_path: Path):
        # The web process serves the agent's wheel whose digest the worker pins in the user data.
        child_env = {**child_env, "RESPAWN_AGENT_DIST_DIR": str(built_dist_dir())}
        self.web, self.tmp_path = WebServer(child_env, tmp_path / "web.log"), tmp_path
        # Reconcile twice a second, not child_env's five times: each run also lists our VMs on the
        # emulated cloud (the orphan sweep). A 3 s heartbeat timeout, not child_env's 1 s: under a
        # loaded CI one heartbeat of a VM saving its notice checkpoint came late, and the control
        # plane rightly ended the VM lost before its exit report; a loss is still found within 3.5 s.
        self.env = {**child_env, **cloud.env, "RESPAWN_API_URL": self.web.url, "RESPAWN_PROVIDERS": cloud.name,
                    "RESPAWN_PROVIDER_CONFIG": json.dumps({cloud.name: cloud.config}),
                    "RESPAWN_RECONCILE_INTERVAL_S": "0.5", "RESPAWN_HEARTBEAT_TIMEOUT_S": "3"}
        self.player, self.playing = VmPlayer(cloud.cloud, tmp_path / "vms"), False
        self.worker = self.beat = None
        setup = make_team_with_members()
        self.job = make_job(setup.team, setup.people["member"].user,
                            command=[*TRAIN, "--step-delay", str(STEP_DELAY_S)], total_steps=STEPS,
                            checkpoint_uri=str(tmp_path / "bucket"), checkpoint_interval_s=0.5,
                            allowed_clouds=[cloud.name], allowed_regions=[cloud.region],
                            instance_types=[cloud.instance_type])

    def start(self) -> "CloudRun":
        self.worker, self.beat = start_worker_and_beat(self.env, self.tmp_path)
        self.web.start()  # waits until it serves; the worker and beat boot meanwhile
        self.playing = bool(self.player.__enter__())
        return self

    def stop(self) -> None:
        if self.playing:
            self.player.__exit__(None, None, None)
        stops = [threading.Thread(target=proc.stop) for proc in (self.beat, self.worker, self.web) if proc]
        for thread in stops:  # together: each may wait out its own graceful shutdown
            thread.start()
        for thread in stops:
            thread.join()

    def wait(self, predicate, what: str, timeout: float) -> None:
        try:
            wait_until(predicate, timeout=timeout, what=what, proc=self.worker, interval=0.1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.story()}") from None

    def story(self) -> str:
        job = Job.objects.get(pk=self.job.pk)
        instances = [(i.pk, i.provider_instance_id, i.state, i.end_reason) for i in Instance.objects.filter(job=job)]
        return f"job: {job.status} ({job.status_reason}); instances: {instances}\n{self.player.story()}"

    def first_vm_trains(self) -> tuple[PlayedVm, Instance]:
        """The first VM, once its agent has registered and committed a checkpoint."""
        self.wait(lambda: self.player.booted(1), "the first VM to boot", 60)
        self.wait(lambda: Checkpoint.objects.filter(job=self.job).exists(),
                  "the first VM's agent to commit a checkpoint", 60)
        vm = self.player.vms[0]
        return vm, Instance.objects.get(job=self.job, provider_instance_id=vm.vm.provider_instance_id)

    def replacement_finishes(self, first: Instance) -> Instance:
        """The job, resumed on a second VM, succeeds; that VM's instance."""
        self.wait(lambda: Job.objects.get(pk=self.job.pk).status in JobStatus.TERMINAL, "the job to finish", 90)
        job = Job.objects.get(pk=self.job.pk)
        assert job.status == JobStatus.SUCCEEDED, (job.failure_message, self.story())
        first.refresh_from_db()
        assert first.end_reason == EndReason.PREEMPTED and job.preemptions == 1, self.story()
        assert len(self.player.vms) == 2, self.story()
        second = Instance.objects.get(job=job, provider_instance_id=self.player.vms[1].vm.provider_instance_id)
        assert second.end_reason == EndReason.COMPLETED
        return second


@pytest.fixture
def run(cloud, child_env, tmp_path):
    cloud_run = CloudRun(cloud, child_env, tmp_path)
    try:
        yield cloud_run.start()
    finally:
        cloud_run.stop()


def assert_resumed_from(instance: Instance, checkpoint: Checkpoint) -> None:
    """The control plane named `checkpoint`, and the trainer really went on from its step:
    the agent reports that step until its trainer reports, then the trainer's steps are
    past it (from scratch, it would report steps below it)."""
    assert instance.resume_checkpoint == checkpoint
    steps = MetricPoint.objects.filter(instance=instance, step__gt=0).values_list("step", flat=True)
    assert steps and min(steps) >= checkpoint.step and max(steps) > checkpoint.step, (checkpoint.step, sorted(steps)[:5])


@pytest.mark.e2e
@pytest.mark.timeout(180)
@pytest.mark.parametrize("cloud", ["aws", "azure"], indirect=True)
def test_a_vm_reclaimed_after_a_notice_is_replaced_and_resumes_from_the_notice_checkpoint(cloud, run, reference):
    vm, first = run.first_vm_trains()

    vm.notice(deadline_in_s=NOTICE_DEADLINE_S)
    run.wait(lambda: Instance.objects.get(pk=first.pk).end_reason, "the noticed instance to end", NOTICE_DEADLINE_S * 2)
    run.player.reclaim(vm)  # the deadline: the cloud takes the VM back

    second = run.replacement_finishes(first)
    notice = InterruptionEvent.objects.get(instance=first, kind="notice")
    assert notice.source == NOTICE_SOURCE[cloud.name] and notice.checkpoint_saved
    if cloud.name == "azure":  # the agent started the eviction (StartRequests) once its checkpoint was safe
        metadata = vm.metadata.snapshot()
        assert metadata["acknowledged"] == [metadata["event_id"]]
    assert_resumed_from(second, Checkpoint.objects.get(instance=first, kind="notice"))
    assert Job.objects.get(pk=run.job.pk).artifact_digest == reference.digest


@pytest.mark.e2e
@pytest.mark.timeout(180)
@pytest.mark.parametrize("cloud", ["gcp"], indirect=True)
def test_a_vm_lost_without_a_word_is_found_gone_by_the_control_plane_and_replaced_from_its_last_checkpoint(
        cloud, run, reference):
    vm, first = run.first_vm_trains()

    run.player.reclaim(vm, hard=True)  # power gone, then the VM deleted: no notice, no exit report

    second = run.replacement_finishes(first)
    assert list(InterruptionEvent.objects.filter(instance=first).values_list("kind", "source")) == [
        ("preempted", "provider_api")]
    assert_resumed_from(second, Checkpoint.objects.filter(instance=first).latest("step"))
    assert Job.objects.get(pk=run.job.pk).artifact_digest == reference.digest
