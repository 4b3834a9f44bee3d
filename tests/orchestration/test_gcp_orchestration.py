"""Scheduling, launching, failover, fencing and orphan reaping, driven through
the real google-cloud-compute client against the Compute emulator."""

import pytest
from django.utils import timezone

from respawn_server.jobs.core.choices import EndReason, FailureCause, InstanceState, JobStatus
from respawn_server.jobs.fleet.launcher import launch, terminate
from respawn_server.jobs.fleet.leftovers import reap_orphans
from respawn_server.jobs.fleet.reconciler import confirm_silent, resend_lost_launches
from respawn_server.jobs.fleet.registry import provider_for
from respawn_server.jobs.fleet.scheduler import schedule
from respawn_server.jobs.models import Instance, InterruptionEvent, Job, PriceQuote
from respawn_server.jobs.people.tokens import hash_token
from tests.emulators.gcp_compute import GcpComputeEmulator
from tests.factories import make_job, make_team_with_members

PROJECT = "respawn-test"


@pytest.fixture(scope="module")
def gce():
    with GcpComputeEmulator() as emulator:
        yield emulator


@pytest.fixture
def gcp(settings, gce, agent_wheel):
    gce.instances.clear()
    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": ["gcp"], "PROVIDER_CONFIG": {"gcp": {
        "project": PROJECT, "api_endpoint": gce.endpoint, "credentials": "anonymous", "poll_interval_s": 0}}}
    provider_for.cache_clear()
    yield gce
    provider_for.cache_clear()


@pytest.fixture
def team(db):
    return make_team_with_members()


def gcp_job(team, **fields):
    return make_job(team.team, team.people["member"].user, allowed_clouds=["gcp"],
                    instance_types=["a2-highgpu-1g"], **fields)


def launched(job):
    schedule()
    instance = Instance.objects.get(job=job, state=InstanceState.REQUESTED)
    launch(instance.pk)
    instance.refresh_from_db()
    return instance


def test_a_queued_job_is_placed_on_the_cheapest_zone_and_launched(gcp, team):
    job = gcp_job(team)
    instance = launched(job)
    assert Job.objects.get(pk=job.pk).status == JobStatus.PROVISIONING
    assert instance.state == InstanceState.BOOTING and instance.provider_instance_id
    cheapest = PriceQuote.objects.filter(provider="gcp", instance_type="a2-highgpu-1g", market="spot").order_by(
        "usd_per_hour").first()
    assert instance.region == cheapest.region and instance.price_per_hour_at_launch == cheapest.usd_per_hour
    (zone, name), vm = next(iter(gcp.instances.items()))
    assert vm["scheduling"]["provisioningModel"] == "SPOT"
    assert vm["labels"]["respawn-instance"] == str(instance.pk)
    token = gcp.startup_script(zone, name).split("printf '%s' ")[1].split(" ")[0].strip("'")
    assert hash_token(token) == instance.bootstrap_token_hash  # the VM's user data carries our bootstrap token


def test_the_vm_boots_the_jobs_image_for_its_cloud_and_its_user_data_pins_the_agent_wheel(gcp, team, agent_wheel):
    image = "projects/deeplearning-platform-release/global/images/family/common-cu124"
    launched(gcp_job(team, machine_image={"aws": "ami-0123456789abcdef0", "gcp": image},
                     container_image="ghcr.io/example/resnet:2.3"))
    _, body = gcp.insert_bodies()[-1]
    assert body["disks"][0]["initializeParams"]["sourceImage"] == image  # not the container image, not AWS's
    script = next(item["value"] for item in body["metadata"]["items"] if item["key"] == "startup-script")
    assert f"{agent_wheel.wheel} {agent_wheel.wheel_sha256} {agent_wheel.requirements_sha256}" in script


def test_a_launch_without_an_agent_wheel_fails_the_job_as_prechecks_with_the_fix(gcp, team, settings, tmp_path):
    settings.RESPAWN = {**settings.RESPAWN, "AGENT_DIST_DIR": str(tmp_path / "no-dist")}
    job = gcp_job(team)
    launched(job)
    job.refresh_from_db()
    assert (job.status, job.failure_cause) == (JobStatus.FAILED, FailureCause.PRECHECKS)
    assert "run `manage.py build_agent_wheel`" in job.failure_message
    assert not gcp.instances


def test_launching_twice_makes_one_vm(gcp, team):
    instance = launched(gcp_job(team))
    Instance.objects.filter(pk=instance.pk).update(state=InstanceState.REQUESTED)  # as if the first try's reply was lost
    launch(instance.pk)
    assert len(gcp.instances) == 1


def test_queue_order_is_priority_then_age_within_the_gpu_limit(gcp, team):
    team.team.max_concurrent_gpus = 1
    team.team.save()
    low = gcp_job(team, name="low", priority=0)
    high = gcp_job(team, name="high", priority=10)
    schedule()
    assert Job.objects.get(pk=high.pk).status == JobStatus.PROVISIONING
    low.refresh_from_db()
    assert low.status == JobStatus.QUEUED and "GPU limit (1 of 1 in use)" in low.status_reason


def test_a_stock_out_backs_the_zone_off_and_fails_over_to_the_next(gcp, team):
    job = gcp_job(team)
    gcp.fail_next_insert("ZONE_RESOURCE_POOL_EXHAUSTED")
    first = launched(job)
    assert first.state == InstanceState.ENDED and first.end_reason == EndReason.CAPACITY_ERROR
    assert InterruptionEvent.objects.get(instance=first).kind == "capacity_error"
    assert Job.objects.get(pk=job.pk).status == JobStatus.RECOVERING
    second = launched(job)
    assert second.state == InstanceState.BOOTING and second.zone != first.zone


def test_a_quota_error_fails_the_job_with_the_clouds_message(gcp, team):
    job = gcp_job(team)
    gcp.fail_next_insert("QUOTA_EXCEEDED", http_status=403, message="Quota 'NVIDIA_A100_GPUS' exceeded. Limit: 0.0")
    launched(job)
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and job.failure_cause == FailureCause.PRECHECKS
    assert "NVIDIA_A100_GPUS" in job.failure_message


def test_a_silent_instance_the_cloud_says_is_gone_counts_as_preempted(gcp, team):
    job = gcp_job(team)
    instance = launched(job)
    Instance.objects.filter(pk=instance.pk).update(state=InstanceState.RUNNING, heartbeat_deadline=timezone.now())
    Job.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING)
    (zone, name), _ = next(iter(gcp.instances.items()))
    gcp.preempt(zone, name)
    confirm_silent(Instance.objects.get(pk=instance.pk))
    instance.refresh_from_db()
    assert instance.end_reason == EndReason.PREEMPTED
    job.refresh_from_db()
    assert job.status == JobStatus.RECOVERING and job.preemptions == 1


def test_a_silent_instance_still_running_is_terminated_before_it_is_replaced(gcp, team):
    job = gcp_job(team)
    instance = launched(job)
    Instance.objects.filter(pk=instance.pk).update(state=InstanceState.RUNNING, heartbeat_deadline=timezone.now())
    Job.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING)
    confirm_silent(Instance.objects.get(pk=instance.pk))
    assert Instance.objects.get(pk=instance.pk).end_reason == EndReason.LOST
    assert not gcp.instances  # fenced: no two VMs train the same slot


def test_vms_the_database_does_not_know_are_terminated(gcp, team):
    instance = launched(gcp_job(team))
    Instance.objects.filter(pk=instance.pk).update(state=InstanceState.ENDED, end_reason=EndReason.FENCED)
    assert reap_orphans() == 1
    assert not gcp.instances


def test_cancel_terminates_every_live_vm(gcp, team, django_capture_on_commit_callbacks):
    from respawn_server.jobs.core.services import cancel_job

    job = gcp_job(team)
    instance = launched(job)
    with django_capture_on_commit_callbacks() as callbacks:
        cancel_job(job, by=team.people["member"].user)
    assert Job.objects.get(pk=job.pk).status == JobStatus.CANCELLING
    terminate(instance.pk)  # what the enqueued terminate task does
    assert not gcp.instances
    assert Instance.objects.get(pk=instance.pk).end_reason == EndReason.CANCELLED
    assert Job.objects.get(pk=job.pk).status == JobStatus.CANCELLED
    assert callbacks  # the web side only enqueued work


def test_a_launch_whose_message_was_lost_is_sent_again(gcp, team, settings, monkeypatch,
                                                         django_capture_on_commit_callbacks):
    from datetime import timedelta

    from respawn_server.jobs.core import nudges

    settings.RESPAWN = {**settings.RESPAWN, "LAUNCH_RESEND_S": 30}
    job = gcp_job(team)
    schedule()  # its launch message is "lost": nothing consumes it here
    instance = Instance.objects.get(job=job)
    assert resend_lost_launches() == 0  # too young: the first message may still be on its way
    Instance.objects.filter(pk=instance.pk).update(requested_at=timezone.now() - timedelta(minutes=5))
    sent = []
    monkeypatch.setattr(nudges, "send", lambda task, *args: sent.append((task, *args)))  # the broker boundary
    with django_capture_on_commit_callbacks(execute=True):
        assert resend_lost_launches() == 1
    assert sent == [("respawn_server.jobs.tasks.launch_instance", instance.pk)]
    launch(instance.pk)
    launch(instance.pk)  # the original message arriving late changes nothing
    assert len(gcp.instances) == 1
