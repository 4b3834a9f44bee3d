"""Stopping the control plane that runs the local VMs (`make demo` on Ctrl-C) is no
preemption: each VM it terminates ends `cancelled` at that moment, bills to it, puts
no zone on back-off, and its job resumes from its newest checkpoint when the control
plane runs again. Real local VMs run the real agent and the tiny trainer against a
real web server; the reconcile that follows is the one a restarted demo runs."""

import sys
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from respawn_server.jobs.core.choices import EndReason, InstanceState, JobStatus
from respawn_server.jobs.fleet.launcher import launch, terminate_local_vms
from respawn_server.jobs.fleet.placement import placement_events
from respawn_server.jobs.fleet.providers.base import CloudState
from respawn_server.jobs.fleet.registry import provider_for
from respawn_server.jobs.fleet.scheduler import provision
from respawn_server.jobs.models import Instance, InterruptionEvent, Job, ServiceBeat, StepPoint
from respawn_server.jobs.money.costs import job_cost
from respawn_server.jobs.tasks import AGENT_API_BEAT, reconcile
from tests.conftest import wait_until
from tests.factories import make_job, make_team_with_members
from tests.local_provider.helpers import FAST_AGENT_ENV


@pytest.fixture
def local_cloud(settings, child_env, web_server):
    """The local provider of `child_env`'s var dir, its agents reporting to `web_server`,
    which times heartbeats out after 1 s (child_env)."""
    settings.RESPAWN = {
        **settings.RESPAWN, "API_URL": web_server.url, "HEARTBEAT_TIMEOUT_S": 1.0, "PROVIDERS": ["local"],
        "PROVIDER_CONFIG": {"local": {"root": f"{child_env['RESPAWN_VAR_DIR']}/local-vms", "market_mode": "none",
                                      "agent_env": FAST_AGENT_ENV, "terminate_grace_s": 10.0}},
    }
    provider_for.cache_clear()
    yield provider_for("local")
    provider_for.cache_clear()


@pytest.mark.e2e
def test_a_vm_terminated_by_the_stopping_control_plane_ends_cancelled_then_and_costs_its_job_nothing_more(
        local_cloud, tmp_path, django_capture_on_commit_callbacks):
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, allowed_clouds=["local"], instance_types=["cpu-small"],
                   command=[sys.executable, "-m", "respawn.examples.tiny", "--step-delay", "0.02"],
                   total_steps=100_000, checkpoint_uri=str(tmp_path / "ckpt"), checkpoint_interval_s=1.0)
    with django_capture_on_commit_callbacks():  # its launch message: launched right here instead
        [instance_id] = provision(job)
    launch(instance_id)
    instance = Instance.objects.get(pk=instance_id)
    wait_until(lambda: Job.objects.get(pk=job.pk).newest_checkpoint_id is not None, timeout=90,
               what="the job to train and commit a checkpoint on its local VM",
               explain=lambda: local_cloud.vm_dir(instance.provider_instance_id).agent_log.read_text())

    before = timezone.now()
    step_at_stop = Instance.objects.get(pk=instance_id).last_step
    assert terminate_local_vms() == [instance.provider_instance_id]
    after = timezone.now()
    assert local_cloud.describe(instance.provider_instance_id).state == CloudState.GONE

    # The demo starts again after the heartbeat deadline has passed, with its API serving.
    while timezone.now() <= Instance.objects.get(pk=instance_id).heartbeat_deadline:
        time.sleep(0.1)
    ServiceBeat.objects.update_or_create(name=AGENT_API_BEAT, defaults={
        "last_seen": timezone.now(), "serving_since": timezone.now() - timedelta(seconds=5)})
    with django_capture_on_commit_callbacks():
        reconcile()

    instance.refresh_from_db()
    job.refresh_from_db()
    assert (instance.state, instance.end_reason) == (InstanceState.ENDED, EndReason.CANCELLED)
    assert before <= instance.ended_at <= after
    assert before <= job_cost(job, now=after + timedelta(hours=1)).work[instance_id].billed_to <= after
    assert not InterruptionEvent.objects.filter(instance__job=job).exists()
    assert job.preemptions == 0
    assert not placement_events(timezone.now())
    # What the VM committed on its way down was recorded, and the job is placed again at
    # once, in the same zone (none is on back-off), to resume from it.
    assert job.newest_checkpoint.step >= step_at_stop
    # And so was every step up to it (flushed on the way down, the instance already ended
    # `cancelled`): the loss curve has no gap before the stop.
    recorded = set(StepPoint.objects.filter(instance=instance).values_list("step", flat=True))
    assert set(range(1, job.newest_checkpoint.step + 1)) <= recorded, sorted(
        set(range(1, job.newest_checkpoint.step + 1)) - recorded)[-30:]
    assert job.status == JobStatus.PROVISIONING
    replacement = Instance.objects.filter(job=job).exclude(pk=instance_id).get()
    assert (replacement.state, replacement.zone) == (InstanceState.REQUESTED, instance.zone)
