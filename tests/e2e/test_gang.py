"""A 2-node job (a gang) on the local provider, end to end: interrupted on node 1
only, by a notice or by killing its VM outright, it is relaunched as a whole gang
and still finishes with bitwise the weights of a 2-node run never interrupted. On a
notice the new gang is a gang of spares, booted while the old one trains on
(docs/spares.md).

Real processes throughout: gunicorn, a Celery worker and beat, two detached
local "VMs" per gang, each running the agent, which runs its rank of the
trainer (torch.distributed over gloo).

tests/orchestration/test_gang_exits.py pins, on the database alone, the control
plane's judgement of a node killed outright, which these runs only sometimes reach."""

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from respawn_server.jobs.core.choices import EndReason, InstanceState, JobStatus
from respawn_server.jobs.models import Checkpoint, Instance, InterruptionEvent, Job, LogChunk, MetricPoint
from respawn_server.jobs.money.downtime import job_downtime
from tests.conftest import ROOT, free_port, wait_until
from tests.e2e.stack import local_gang_stack
from tests.factories import make_job, make_team_with_members
from tests.history import job_story

STEPS, STEP_DELAY_S, EVERY_STEPS, NODES = 150, 0.03, 25, 2
TRAIN = [sys.executable, "-m", "respawn.examples.tiny_gang", "--steps", str(STEPS), "--every-steps", str(EVERY_STEPS)]


def exported_digest(uri: Path) -> str:
    exported = uri / "export" / f"step-{STEPS:08d}" / "model.safetensors"
    return "sha256:" + hashlib.sha256(exported.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def reference_digest(tmp_path_factory) -> str:
    """The exported weights of the same 2-rank training, never interrupted."""
    uri = tmp_path_factory.mktemp("gang") / "reference"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPAWN_")}
    env.update(WORLD_SIZE=str(NODES), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    ranks = [subprocess.Popen([*TRAIN, "--uri", str(uri)], cwd=ROOT, env={**env, "RANK": str(rank)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for rank in range(NODES)]
    for proc in ranks:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    return exported_digest(uri)


@pytest.fixture
def gang_job(child_env, web_server, tmp_path):
    """A 2-node job run by a real worker and beat; yields (job, the VMs' provider, env)."""
    env = {**child_env, "RESPAWN_API_URL": web_server.url, "RESPAWN_LOCAL_MARKET": "none",
           "RESPAWN_HEARTBEAT_TIMEOUT_S": "3", "RESPAWN_RECONCILE_INTERVAL_S": "0.5",
           "RESPAWN_NOTICE_BUDGET_S": "5"}  # a 30 s notice then leaves 25 s for spares to boot
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, nodes=NODES,
                   command=[*TRAIN, "--step-delay", str(STEP_DELAY_S)], total_steps=STEPS,
                   checkpoint_uri=str(tmp_path / "ckpt"), allowed_clouds=["local"], instance_types=["cpu-small"],
                   validation_model_factory="respawn.examples.tiny:make_model",
                   validation_batch_factory="respawn.examples.tiny:validation_batch")
    with local_gang_stack(job, env, tmp_path) as running:
        yield running


def first_gang_running_with_a_checkpoint(job: Job, vms, worker) -> list[Instance]:
    """Wait until every node of the first gang runs and a checkpoint past step 0 is committed."""
    wait_until(lambda: Job.objects.get(pk=job.pk).status == JobStatus.RUNNING
               and Checkpoint.objects.filter(job=job, step__gt=0).exists(),
               timeout=120, what="the gang to run and commit a checkpoint", proc=worker, interval=0.2,
               explain=lambda: job_story(job.pk, vms))
    gang = list(Instance.objects.filter(job=job, state=InstanceState.RUNNING).order_by("rank"))
    assert [i.rank for i in gang] == list(range(NODES))
    return gang


def run_to_the_end(job: Job, vms, worker) -> Job:
    wait_until(lambda: Job.objects.get(pk=job.pk).status in JobStatus.TERMINAL, timeout=240,
               what="the job to finish", proc=worker, interval=0.5, explain=lambda: job_story(job.pk, vms))
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, (job.status, job.status_reason, job.failure_message)
    return job


def two_gangs(job: Job, vms) -> list[list[Instance]]:
    """The job's instances, gang by gang (each provisioned as NODES consecutive rows):
    the one interrupted and the one that finished."""
    rows = list(Instance.objects.filter(job=job).order_by("pk"))
    assert len(rows) == 2 * NODES, job_story(job.pk, vms)
    return [rows[:NODES], rows[NODES:]]


@pytest.mark.e2e
def test_a_notice_to_node_1_only_saves_the_same_step_on_both_and_the_gang_finishes_exactly(gang_job, reference_digest):
    job, vms, worker = gang_job
    first = first_gang_running_with_a_checkpoint(job, vms, worker)
    metadata_url = vms.vm_dir(first[1].provider_instance_id).metadata_url_file.read_text()
    requests.post(f"{metadata_url}/_respawn/notice", json={"in_s": 0, "deadline_in_s": 30}, timeout=5).raise_for_status()
    wait_until(lambda: not Instance.objects.filter(pk__in=[i.pk for i in first], state__in=InstanceState.LIVE).exists(),
               timeout=60, what="the interrupted gang to end", proc=worker, interval=0.2,
               explain=lambda: job_story(job.pk, vms))
    # Both ranks saved the one notice step: its single commit holds both ranks' shards.
    notice = Checkpoint.objects.get(job=job, kind="notice")
    manifest = json.loads((Path(notice.uri) / "MANIFEST.json").read_text())
    assert {f"data-r{rank}-0.bin" for rank in range(NODES)} <= set(manifest["files"])
    assert InterruptionEvent.objects.get(instance=first[1], kind="notice").checkpoint_saved  # within its deadline

    job = run_to_the_end(job, vms, worker)
    interrupted, relaunched = two_gangs(job, vms)
    assert job.preemptions == 1, job_story(job.pk, vms)
    assert [i.end_reason for i in interrupted] == [EndReason.FENCED, EndReason.PREEMPTED], job_story(job.pk, vms)
    assert [i.end_reason for i in relaunched] == [EndReason.COMPLETED] * NODES
    assert [i.resume_checkpoint_id for i in relaunched] == [notice.pk] * NODES
    assert len({i.rendezvous_addr for i in interrupted + relaunched}) == 2  # a fresh rendezvous per gang
    # The new gang is the spares launched on the notice, one per node, booted before the old
    # gang ended and promoted together; never two gangs training: the first step of each
    # spare came after every old node had ended.
    old_ended = max(i.ended_at for i in interrupted)
    assert all(i.requested_at < old_ended for i in relaunched), job_story(job.pk, vms)
    assert all(job.events.filter(message__contains=f"spare instance {i.pk} promoted").exists() for i in relaunched)
    for spare in relaunched:
        first = MetricPoint.objects.filter(instance=spare, step__gt=notice.step).order_by("time").first()
        assert first is None or first.time > old_ended, job_story(job.pk, vms)
    noticed_log = "\n".join(line for chunk in LogChunk.objects.filter(instance=interrupted[1]) for line in chunk.lines)
    assert "training on while a spare boots" in noticed_log, noticed_log[-3000:]
    _, downtimes = job_downtime(job.pk, job.finished_at)
    assert [d.parts["capacity"] for d in downtimes] == [0], downtimes  # the spares were there
    assert job.artifact_digest == reference_digest


@pytest.mark.e2e
def test_node_1_killed_outright_the_gang_resumes_from_the_last_commit_and_finishes_exactly(gang_job, reference_digest):
    job, vms, worker = gang_job
    first = first_gang_running_with_a_checkpoint(job, vms, worker)
    for pid in vms.processes(first[1].provider_instance_id):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_until(lambda: not Instance.objects.filter(pk__in=[i.pk for i in first], state__in=InstanceState.LIVE).exists(),
               timeout=60, what="the interrupted gang to end", proc=worker, interval=0.2,
               explain=lambda: job_story(job.pk, vms))
    last_commit = Checkpoint.objects.filter(job=job).order_by("-step").first()

    job = run_to_the_end(job, vms, worker)
    interrupted, relaunched = two_gangs(job, vms)
    assert interrupted[1].end_reason in (EndReason.PREEMPTED, EndReason.LOST)
    assert job.preemptions == 1 and job.failure_restarts == 0
    assert not Checkpoint.objects.filter(job=job, kind="notice").exists()  # no collective save with a dead rank
    assert [i.resume_checkpoint_id for i in relaunched] == [last_commit.pk] * NODES and last_commit.step > 0
    assert job.artifact_digest == reference_digest
