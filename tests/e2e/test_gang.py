"""A 2-node job (a gang) on the local provider, end to end: interrupted on node 1
only, by a notice or by killing its VM outright, it is relaunched as a whole gang
and still finishes with bitwise the weights of a 2-node run never interrupted. On a
notice the new gang is a gang of spares, booted while the old one trains on
(docs/spares.md).

Real processes throughout: gunicorn, a Celery worker and beat, two detached
local "VMs" per gang, each running the agent, which runs its rank of the
trainer (torch.distributed over gloo).

The last tests pin, on the database alone, the control plane's judgement of a
node killed outright, which the end-to-end run only sometimes reaches (the
surviving rank's trainer may exit on the broken collective before the dead node's
heartbeat deadline, or hang until it is told to stop)."""

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
GLOO_ERROR = "RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:61625: Connection reset by peer"
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


def test_a_rank_failing_because_its_peers_vm_vanished_counts_as_a_preemption(db, django_capture_on_commit_callbacks):
    from respawn.protocol import ExitReason
    from respawn_server.jobs.fleet.reconciler import check_gang_failure
    from respawn_server.jobs.reports.exits import record_exit
    from tests.factories import make_instance

    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, nodes=NODES, status=JobStatus.RUNNING)
    survivor = make_instance(job, rank=0, state=InstanceState.RUNNING, provider_instance_id="local-900-0000aaaa").instance
    vanished = make_instance(job, rank=1, state=InstanceState.RUNNING, provider_instance_id="local-901-0000bbbb").instance
    with django_capture_on_commit_callbacks() as queued:
        record_exit(survivor, reason=ExitReason.FAILED, exit_code=1, final_step=None, last_exception=GLOO_ERROR,
                    output_tail=GLOO_ERROR, artifact_uri="", artifact_digest="")
    assert len(queued) == 1  # the peers are checked before the code is blamed
    job.refresh_from_db()
    assert (job.status, job.failure_restarts) == (JobStatus.RUNNING, 0)

    check_gang_failure(job.pk, f"exit 1: {GLOO_ERROR}", GLOO_ERROR)  # what the queued task runs
    job.refresh_from_db()
    vanished.refresh_from_db()
    assert vanished.end_reason == EndReason.PREEMPTED  # the local provider has no such VM: gone
    assert (job.status, job.preemptions, job.failure_restarts) == (JobStatus.RECOVERING, 1, 0)


def test_a_rank_failing_with_no_live_peer_left_is_the_codes_failure(db):
    from respawn.protocol import ExitReason
    from respawn_server.jobs.reports.exits import record_exit
    from tests.factories import make_instance

    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, nodes=NODES, status=JobStatus.RUNNING)
    make_instance(job, rank=1, state=InstanceState.ENDED, end_reason=EndReason.FENCED)
    failed = make_instance(job, rank=0, state=InstanceState.RUNNING, provider_instance_id="local-902-0000cccc").instance
    record_exit(failed, reason=ExitReason.FAILED, exit_code=1, final_step=None, last_exception="ValueError: bad",
                output_tail="ValueError: bad", artifact_uri="", artifact_digest="")
    job.refresh_from_db()
    assert (job.status, job.preemptions, job.failure_restarts) == (JobStatus.RECOVERING, 0, 1)


def test_a_node_found_gone_without_a_notice_has_the_rest_of_its_gang_stopped(db, django_capture_on_commit_callbacks):
    from respawn_server.jobs.fleet.reconciler import confirm_silent
    from tests.factories import make_instance

    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, nodes=NODES, status=JobStatus.RUNNING)
    alive = make_instance(job, rank=0, state=InstanceState.RUNNING, provider_instance_id="local-903-0000dddd").instance
    silent = make_instance(job, rank=1, state=InstanceState.RUNNING, provider_instance_id="local-904-0000eeee").instance
    with django_capture_on_commit_callbacks():
        confirm_silent(silent)  # the heartbeat deadline passed; the cloud has no such VM
    alive.refresh_from_db()
    job.refresh_from_db()
    assert alive.requested_action == "stop"  # not checkpoint_and_stop: no collective save can succeed without rank 1
    assert (job.status, job.preemptions) == (JobStatus.RECOVERING, 1)


def test_a_late_judgement_about_a_replaced_gang_leaves_the_new_gang_alone(db, django_capture_on_commit_callbacks):
    from respawn_server.jobs.core.transitions import end_instance
    from respawn_server.jobs.fleet.reconciler import check_gang_failure
    from tests.factories import make_instance

    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, nodes=NODES, status=JobStatus.RUNNING)
    failed = make_instance(job, rank=0, state=InstanceState.RUNNING, provider_instance_id="local-905-0000ffff").instance
    end_instance(failed, EndReason.FAILED)
    for rank in range(NODES):  # the gang was replaced before the queued check ran
        make_instance(job, rank=rank, state=InstanceState.RUNNING, provider_instance_id=f"local-9{rank}6-00001111")
    with django_capture_on_commit_callbacks():
        check_gang_failure(job.pk, f"exit 1: {GLOO_ERROR}", GLOO_ERROR, failed.pk)
    job.refresh_from_db()
    assert (job.status, job.failure_restarts, job.preemptions) == (JobStatus.RUNNING, 0, 0)


def test_a_rank_failing_after_its_peer_was_found_gone_is_not_judged(db):
    """Seen in CI: the survivor's exit report (its collective broke) arrived after the
    reconciler had found the peer gone and moved the job to recovering. It was judged
    as the code's failure, an illegal recovering -> recovering move: a 500, resent
    until the survivor was marked lost."""
    from respawn.protocol import ExitReason
    from respawn_server.jobs.fleet.reconciler import confirm_silent
    from respawn_server.jobs.reports.exits import record_exit
    from tests.factories import make_instance

    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, nodes=NODES, status=JobStatus.RUNNING)
    survivor = make_instance(job, rank=0, state=InstanceState.RUNNING, provider_instance_id="local-907-0000aaaa").instance
    vanished = make_instance(job, rank=1, state=InstanceState.RUNNING, provider_instance_id="local-908-0000bbbb").instance
    confirm_silent(vanished)
    record_exit(survivor, reason=ExitReason.FAILED, exit_code=1, final_step=None, last_exception=GLOO_ERROR,
                output_tail=GLOO_ERROR, artifact_uri="", artifact_digest="")
    job.refresh_from_db()
    survivor.refresh_from_db()
    assert survivor.end_reason == EndReason.FAILED
    assert (job.status, job.preemptions, job.failure_restarts) == (JobStatus.RECOVERING, 1, 0)


def test_an_old_gangs_late_exit_report_leaves_the_new_gang_running(db):
    """Seen in CI: a rank's exit report, resent until after its instance had been marked
    lost and the gang relaunched, asked the new gang to stop; the new gang stopped and
    the job stayed `running` with nothing running it."""
    from respawn.protocol import ExitReason
    from respawn_server.jobs.reports.exits import record_exit
    from tests.factories import make_instance

    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, nodes=NODES, status=JobStatus.RUNNING)
    old = make_instance(job, rank=0, state=InstanceState.ENDED, end_reason=EndReason.LOST).instance
    new = [make_instance(job, rank=rank, state=InstanceState.RUNNING).instance for rank in range(NODES)]
    record_exit(old, reason=ExitReason.FAILED, exit_code=1, final_step=40, last_exception=GLOO_ERROR,
                output_tail=GLOO_ERROR, artifact_uri="", artifact_digest="")
    job.refresh_from_db()
    assert (job.status, job.failure_restarts) == (JobStatus.RUNNING, 0)
    assert [Instance.objects.get(pk=i.pk).requested_action for i in new] == [""] * NODES


def test_a_running_job_whose_last_node_stops_unasked_is_recovered(db):
    from respawn.protocol import ExitReason
    from respawn_server.jobs.reports.exits import record_exit
    from tests.factories import make_instance

    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING)
    only = make_instance(job, state=InstanceState.RUNNING).instance
    record_exit(only, reason=ExitReason.STOPPED, exit_code=-15, final_step=None, last_exception="",
                output_tail="", artifact_uri="", artifact_digest="")
    job.refresh_from_db()
    assert (job.status, job.failure_restarts) == (JobStatus.RECOVERING, 0)


@pytest.mark.django_db(transaction=True)
def test_both_ranks_completing_at_once_succeed_the_job():
    """Each rank's exit is decided in its own transaction. Rank 1's report arrives
    while rank 0's transaction is still open: without the job's lock each saw the
    other still live and neither succeeded the job."""
    from respawn.protocol import ExitReason
    from respawn_server.jobs.reports.exits import record_exit
    from tests.factories import make_instance
    from tests.overlap import in_overlapping_transactions

    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, nodes=NODES, status=JobStatus.RUNNING)
    ranks = [make_instance(job, rank=rank, state=InstanceState.RUNNING).instance for rank in range(NODES)]

    def complete(instance):
        record_exit(instance, reason=ExitReason.COMPLETED, exit_code=0, final_step=STEPS, last_exception="",
                    output_tail="", artifact_uri="", artifact_digest="")

    in_overlapping_transactions(lambda: complete(ranks[0]), lambda: complete(ranks[1]), hold_s=2)
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
