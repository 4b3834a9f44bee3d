"""A job's prepare and post steps, end to end on the local provider: the prepare step
runs once and a relaunch after a preemption reuses its stored outputs; once training
has exported its artifact, the post step runs on an on-demand VM from it. A failing
prepare step fails the job as a setup failure, before any training.

Real processes throughout: gunicorn, a Celery worker, detached local "VMs" each
running the agent. The preemption is a notice served by the VM's own metadata
endpoint, as the simulated market would serve it, but at a moment the test picks."""

import sys

import pytest
import requests

from respawn.metadata_server import CONTROL_PREFIX, MetadataServer
from respawn_server.jobs.core.choices import EndReason, JobStatus, Market, Purpose
from respawn_server.jobs.core.services import create_job
from respawn_server.jobs.fleet.providers.local import LocalConfig, LocalProvider
from respawn_server.jobs.models import Instance, Job
from tests.agent.live import AgentProcess
from tests.conftest import celery_worker, wait_until, writable_by_vms
from tests.factories import make_instance, make_job, make_team_with_members
from tests.history import job_story
from tests.local_provider.helpers import FAST_AGENT_ENV

pytestmark = [pytest.mark.e2e, pytest.mark.store_incidental]

PROGRAMS = [sys.executable, "-m", "tests.steps.programs"]
STEPS = ("prepare", "train", "post")  # each counts its runs in a file


def counted(path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def events(job) -> list[str]:
    return list(job.events.values_list("message", flat=True))


def output(job) -> list[str]:
    return [line for i in job.instances.all() for chunk in i.log_chunks.order_by("offset") for line in chunk.lines]


@pytest.fixture
def control_plane(child_env, web_server, tmp_path):
    """Web server and one Celery worker (which launches the local VMs, so they inherit
    its environment); the local market never preempts on its own."""
    env = {**child_env, **FAST_AGENT_ENV, "RESPAWN_API_URL": web_server.url, "RESPAWN_LOCAL_MARKET": "none"}
    worker = celery_worker(env, tmp_path / "worker.log").start()
    yield worker
    worker.stop()


def submit(tmp_path, **fields):
    setup = make_team_with_members()
    counters = {f"STEPS_{step.upper()}_COUNTER": str(writable_by_vms(tmp_path / f"{step}-runs")) for step in STEPS}
    return create_job(team=setup.team, owner=setup.people["member"].user, name="steps", command=[*PROGRAMS, "train"],
                      total_steps=10, checkpoint_uri=str(tmp_path / "ckpt"), allowed_clouds=["local"],
                      instance_types=["cpu-small"], env=counters, prepare_command=[*PROGRAMS, "prepare"], **fields)


def preempt(instance: Instance, tmp_path) -> None:
    """Serve a preemption notice on the instance's VM, as its cloud would."""
    vms = LocalProvider(LocalConfig(root=str(tmp_path / "var" / "local-vms")))
    url = vms.vm_dir(instance.provider_instance_id).metadata_url_file.read_text()
    requests.post(f"{url}{CONTROL_PREFIX}notice", json={"in_s": 0, "deadline_in_s": 20}, timeout=5).raise_for_status()


def finished(job, worker):
    wait_until(lambda: Job.objects.get(pk=job.pk).status in JobStatus.TERMINAL, timeout=120,
               what="the job to finish", proc=worker, interval=0.2)
    job.refresh_from_db()
    return job


@pytest.mark.timeout(300)
def test_prepare_runs_once_a_relaunch_reuses_it_and_the_post_step_runs_on_demand_from_the_artifact(
        control_plane, tmp_path):
    job = submit(tmp_path, post_command=[*PROGRAMS, "post"])
    vms = LocalProvider(LocalConfig(root=str(tmp_path / "var" / "local-vms")))
    # The first VM boots, runs the prepare step and stores its outputs, then trains: minutes on
    # a loaded machine (90 s once ran out in CI, with nothing said of where it stood).
    wait_until(lambda: counted(tmp_path / "train-runs") == 1, timeout=180, what="the first trainer running",
               proc=control_plane, interval=0.2, explain=lambda: job_story(job.pk, vms))
    assert counted(tmp_path / "prepare-runs") == 1
    preempt(Instance.objects.get(job=job), tmp_path)

    job = finished(job, control_plane)
    assert job.status == JobStatus.SUCCEEDED, (job.status, job.status_reason, job.failure_message, events(job))
    assert job.preemptions == 1
    assert counted(tmp_path / "prepare-runs") == 1  # the relaunch and the post VM fetched the stored outputs
    assert counted(tmp_path / "train-runs") == 2 and counted(tmp_path / "post-runs") == 1
    first, second, post = job.instances.order_by("pk")
    assert first.end_reason == EndReason.PREEMPTED and second.end_reason == EndReason.COMPLETED
    assert (post.purpose, post.market, post.end_reason) == (Purpose.POST, Market.ON_DEMAND, EndReason.COMPLETED)
    assert job.artifact_uri.endswith("model.bin") and job.artifact_digest.startswith("sha256:")

    said = events(job)
    ran = [e for e in said if e.startswith(f"prepare step ran on instance {first.pk}")]
    assert len(ran) == 1 and "outputs stored at" in ran[0], said
    assert any(e.startswith(f"prepare step skipped on instance {second.pk}: outputs for key") for e in said), said
    assert any(e.startswith(f"prepare step skipped on instance {post.pk} (post step)") for e in said), said
    assert any(e.startswith(f"post step: launching instance {post.pk}") and "on-demand" in e for e in said), said
    statuses = list(job.events.exclude(to_status="").values_list("to_status", flat=True))
    assert statuses[-2:] == [JobStatus.FINISHING, JobStatus.SUCCEEDED], statuses

    lines = output(job)
    assert "trainer read 'prepared vocab'" in "\n".join(lines)
    assert f"post step evaluates {job.artifact_uri}: digest verified" in lines, lines[-20:]


def test_a_failing_prepare_step_fails_the_job_as_setup_and_the_trainer_never_starts(child_env, web_server, tmp_path):
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.PROVISIONING,
                   checkpoint_uri=str(tmp_path / "ckpt"), command=[sys.executable, "-c", "print('training')"],
                   prepare_command=[sys.executable, "-c", "print('downloading the corpus'); raise SystemExit(4)"])
    instance = make_instance(job)
    imds = MetadataServer("aws").start()
    agent = AgentProcess({**child_env, "RESPAWN_VALIDATE": "0"}, tmp_path, url=web_server.url,
                         bootstrap_token=instance.bootstrap_token, provider="aws", metadata_url=imds.url).start()
    try:
        job = finished(job, agent)
    finally:
        agent.stop(9)
        imds.stop()
    assert (job.status, job.failure_cause) == (JobStatus.FAILED, "setup"), (job.status, job.status_reason)
    assert "prepare step failed: the prepare command exited with code 4" in job.failure_message
    assert f"prepare step failed on instance {instance.instance.pk}" in "\n".join(events(job))
    lines = output(job)
    assert "downloading the corpus" in lines and "training" not in lines
