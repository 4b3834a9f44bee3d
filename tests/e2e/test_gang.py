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

import contextlib
import functools
import hashlib
import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import requests

from respawn_server.jobs.core.choices import EndReason, InstanceState, JobStatus
from respawn_server.jobs.models import Checkpoint, Instance, InterruptionEvent, Job, LogChunk, MetricPoint
from respawn_server.jobs.money.downtime import job_downtime
from tests.conftest import FAST_LIVENESS, ROOT, free_port, wait_until
from tests.e2e.stack import local_gang_stack, running_with_a_commit
from tests.factories import make_job, make_team_with_members
from tests.history import job_story

STEP_DELAY_S, EVERY_STEPS, NODES = 0.03, 25, 2
# A notice holds the gang training while its spares boot, at most until only the save budget
# is left of the notice's deadline (docs/spares.md). Posted once the gang's first checkpoint is
# on disk, it lands mid-run however slowly a loaded machine boots the spares only when the
# gang trains on for longer than that hold: 1000 steps are 30 s.
NOTICE_DEADLINE_S, NOTICE_BUDGET_S, NOTICE_STEPS = 30, 5, 1000
KILL_STEPS = 150  # a gang with a node killed outright is relaunched at once: no hold to outlast
# Generous: a node's heartbeat late by seconds on a loaded 2-core machine is not a lost node.
HEARTBEAT_TIMEOUT_S = 10
# On the embedded store too, the elastic gang's three nodes (tests/e2e/test_elastic.py)
# write at once: these two-node runs add nothing there that the store decides.
pytestmark = pytest.mark.store_incidental


def trainer(steps: int) -> list[str]:
    return [sys.executable, "-m", "respawn.examples.tiny_gang", "--steps", str(steps), "--every-steps", str(EVERY_STEPS)]


def gang_command(steps: int) -> list[str]:
    """A job's 2-rank training to `steps`, slowed so that a test can act on it mid-run."""
    return [*trainer(steps), "--step-delay", str(STEP_DELAY_S)]


@pytest.fixture
def liveness():
    return {**FAST_LIVENESS, "RESPAWN_HEARTBEAT_TIMEOUT_S": str(HEARTBEAT_TIMEOUT_S), "RESPAWN_RECONCILE_INTERVAL_S": "0.5"}


@pytest.fixture(scope="module")
def reference_digest(tmp_path_factory):
    """The exported weights of the same 2-rank training to `steps`, never interrupted: run once per `steps`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPAWN_")}

    @functools.cache
    def digest(steps: int) -> str:
        uri = tmp_path_factory.mktemp("gang") / "reference"
        gang = {**env, "WORLD_SIZE": str(NODES), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        ranks = [subprocess.Popen([*trainer(steps), "--uri", str(uri)], cwd=ROOT, env={**gang, "RANK": str(rank)},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for rank in range(NODES)]
        for proc in ranks:
            _, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
        exported = uri / "export" / f"step-{steps:08d}" / "model.safetensors"
        return "sha256:" + hashlib.sha256(exported.read_bytes()).hexdigest()

    return digest


@pytest.fixture
def gang_job(child_env, web_server, tmp_path):
    """Starts a 2-node job training to `steps`, run by a real worker and beat: returns
    (job, the VMs' provider, the worker); stopped at the test's end."""
    env = {**child_env, "RESPAWN_API_URL": web_server.url, "RESPAWN_LOCAL_MARKET": "none",
           "RESPAWN_NOTICE_BUDGET_S": str(NOTICE_BUDGET_S)}
    setup = make_team_with_members()

    def start(steps: int, **fields):
        job = make_job(setup.team, setup.people["member"].user, nodes=NODES, command=gang_command(steps),
                       total_steps=steps, checkpoint_uri=str(tmp_path / "ckpt"), allowed_clouds=["local"],
                       instance_types=["cpu-small"], validation_model_factory="respawn.examples.tiny:make_model",
                       validation_batch_factory="respawn.examples.tiny:validation_batch", **fields)
        return stack.enter_context(local_gang_stack(job, env, tmp_path))

    with contextlib.ExitStack() as stack:
        yield start


def first_gang_training(job: Job, vms, worker) -> list[Instance]:
    """Wait until every node of the first gang runs and has committed a checkpoint past step 0."""
    wait_until(lambda: running_with_a_commit(job), timeout=120, what="the gang to run and commit a checkpoint", proc=worker, interval=0.1,
               explain=lambda: job_story(job.pk, vms))
    gang = list(Instance.objects.filter(job=job, state=InstanceState.RUNNING).order_by("rank"))
    assert [i.rank for i in gang] == list(range(NODES))
    # The web server sets each heartbeat's deadline: it runs on this module's slack too.
    assert {i.heartbeat_deadline - i.last_heartbeat_at for i in gang} == {timedelta(seconds=HEARTBEAT_TIMEOUT_S)}
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


def the_gang_ended(job: Job, first: list[Instance], vms, worker) -> None:
    """Wait until every node of the interrupted gang `first` has ended."""
    wait_until(lambda: not Instance.objects.filter(pk__in=[i.pk for i in first], state__in=InstanceState.LIVE).exists(),
               timeout=60, what="the interrupted gang to end", proc=worker, interval=0.2,
               explain=lambda: job_story(job.pk, vms))


def the_gang_ended_on_one_notice_step(job: Job, first: list[Instance], vms, worker) -> Checkpoint:
    """Wait for the noticed gang to end; its notice checkpoint, whose single commit holds both
    ranks' shards (the whole gang saved the one step). Read at once: the next gang's commits
    retire it from disk."""
    the_gang_ended(job, first, vms, worker)
    notice = Checkpoint.objects.filter(job=job, kind="notice").first()
    assert notice is not None, job_story(job.pk, vms)
    manifest = json.loads((Path(notice.uri) / "MANIFEST.json").read_text())
    assert {f"data-r{rank}-0.bin" for rank in range(NODES)} <= set(manifest["files"]), job_story(job.pk, vms)
    return notice


@pytest.mark.e2e
def test_a_notice_to_node_1_only_saves_the_same_step_on_both_and_the_gang_finishes_exactly(gang_job, reference_digest):
    job, vms, worker = gang_job(NOTICE_STEPS)
    first = first_gang_training(job, vms, worker)
    metadata_url = vms.vm_dir(first[1].provider_instance_id).metadata_url_file.read_text()
    requests.post(f"{metadata_url}/_respawn/notice", json={"in_s": 0, "deadline_in_s": NOTICE_DEADLINE_S},
                  timeout=5).raise_for_status()
    notice = the_gang_ended_on_one_notice_step(job, first, vms, worker)
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
    assert job.artifact_digest == reference_digest(NOTICE_STEPS)


@pytest.mark.e2e
def test_with_the_memory_tier_the_gangs_spares_take_its_notice_step_into_their_stores_and_resume_from_memory(
        gang_job, reference_digest):
    """docs/memory-tier.md: each node's notice shard reaches its own spare's store, sent by
    its trainer when its stop named that store before the gang saved, else by its agent
    once the trainer has exited. The spares' gang finds the step whole in its own stores,
    resumes from memory, validated, and ends bitwise as the uninterrupted training."""
    job, vms, worker = gang_job(NOTICE_STEPS, env={"RESPAWN_MEMORY_TIER": "on"})
    first = first_gang_training(job, vms, worker)
    metadata_url = vms.vm_dir(first[1].provider_instance_id).metadata_url_file.read_text()
    requests.post(f"{metadata_url}/_respawn/notice", json={"in_s": 0, "deadline_in_s": NOTICE_DEADLINE_S},
                  timeout=5).raise_for_status()
    notice = the_gang_ended_on_one_notice_step(job, first, vms, worker)
    job = run_to_the_end(job, vms, worker)
    interrupted, relaunched = two_gangs(job, vms)
    story = job_story(job.pk, vms)
    assert [i.resume_checkpoint_id for i in relaunched] == [notice.pk] * NODES, story
    logs = ["\n".join(line for chunk in LogChunk.objects.filter(instance=i) for line in chunk.lines)
            for i in interrupted + relaunched]
    spares = [Instance.objects.get(pk=i.pk).handover_address for i in relaunched]
    for rank, log in enumerate(logs[:NODES]):
        # Its trainers sent it (their stop named the store before they saved), or its agent did.
        assert f"notice save of step {notice.step}: in the memory tier (the spare's store at {spares[rank]})" in log \
            or f"rank {rank}'s step {notice.step} handed to the spare's store at {spares[rank]}" in log, log[-3000:]
    for rank, log in enumerate(logs[NODES:]):
        assert f"rank {rank} resumed at step {notice.step} from the memory tier" in log, log[-3000:]
    assert job.artifact_digest == reference_digest(NOTICE_STEPS)  # bitwise the same training


@pytest.mark.e2e
def test_node_1_killed_outright_the_gang_resumes_from_the_last_commit_and_finishes_exactly(gang_job, reference_digest):
    job, vms, worker = gang_job(KILL_STEPS)
    first = first_gang_training(job, vms, worker)
    for pid in vms.processes(first[1].provider_instance_id):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    the_gang_ended(job, first, vms, worker)
    last_commit = Checkpoint.objects.filter(job=job).order_by("-step").first()

    job = run_to_the_end(job, vms, worker)
    interrupted, relaunched = two_gangs(job, vms)
    assert interrupted[1].end_reason in (EndReason.PREEMPTED, EndReason.LOST)
    assert job.preemptions == 1 and job.failure_restarts == 0
    assert not Checkpoint.objects.filter(job=job, kind="notice").exists()  # no collective save with a dead rank
    assert [i.resume_checkpoint_id for i in relaunched] == [last_commit.pk] * NODES and last_commit.step > 0
    assert job.artifact_digest == reference_digest(KILL_STEPS)
