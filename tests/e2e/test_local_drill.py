"""A drill end to end on the local provider (issue 38): a member asks for it on the API,
a Celery worker interrupts the VM through the provider (the market's notice now), the
agent sees the notice and commits its notice save, a spare or relaunch resumes from it and
trains again, the job finishes; the drill passes against its window, and the job's
preemption counter has not moved. Then the same for one node of a 2-node gang, whose
spares take over at the gang's notice step, with the spares' boot on the drill's money.

Real processes throughout: gunicorn, a Celery worker and beat, detached local "VMs" each
running the agent, which runs the trainer."""

import sys

import pytest
import requests

from respawn_server.jobs.core.choices import CheckpointKind, DrillStatus, EndReason, InterruptionKind, JobStatus
from respawn_server.jobs.drills import report
from respawn_server.jobs.models import Checkpoint, Drill, InterruptionEvent, Job, MetricPoint
from respawn_server.jobs.money import costs
from tests.conftest import WebServer, wait_until
from tests.e2e import test_gang as gang
from tests.e2e.stack import local_gang_stack, run_to_the_end
from tests.factories import make_job, make_team_with_members
from tests.history import job_story

pytestmark = pytest.mark.store_incidental

STEPS, STEP_DELAY_S = 900, 0.03
TRAIN = [sys.executable, "-m", "respawn.examples.tiny", "--steps", str(STEPS), "--step-delay", str(STEP_DELAY_S)]


def served(child_env: dict, tmp_path, **settings):
    """The web server, on a local market that takes no VM, with `settings`; the env for the
    worker and the VMs, and a fresh team with its people."""
    env = {**child_env, "RESPAWN_LOCAL_MARKET": "none", **settings}
    web = WebServer(env, tmp_path / "web.log").start()
    env["RESPAWN_API_URL"] = web.url
    return web, env, make_team_with_members()


def ask_for_drill(web: WebServer, job: Job, member, node: int) -> None:
    answer = requests.post(f"{web.url}/api/v1/jobs/{job.pk}/drill/", json={"node": node}, timeout=30,
                           headers={"Authorization": f"Bearer {member.token}"})
    assert answer.status_code == 202, answer.text


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_a_drill_with_notice_saves_resumes_and_counts_no_preemption(child_env, tmp_path):
    web, env, setup = served(child_env, tmp_path, RESPAWN_LOCAL_NOTICE_S="10", RESPAWN_NOTICE_BUDGET_S="4",
                             RESPAWN_HEARTBEAT_TIMEOUT_S="5", RESPAWN_RECONCILE_INTERVAL_S="1")
    member = setup.people["member"]
    job = make_job(setup.team, member.user, command=TRAIN, total_steps=STEPS, checkpoint_uri=str(tmp_path / "ckpt"),
                   checkpoint_interval_s=30.0, allowed_clouds=["local"], instance_types=["cpu-small"],
                   validation_enabled=False)

    def drill_once_training(worker):
        wait_until(lambda: Job.objects.get(pk=job.pk).status == JobStatus.RUNNING and
                   MetricPoint.objects.filter(job=job, step__gt=50).exists(), timeout=240, what="training",
                   proc=worker, interval=0.5, explain=lambda: job_story(job.pk))
        ask_for_drill(web, job, member, node=0)

    try:
        job = run_to_the_end(job, env, tmp_path, timeout=500, meanwhile=drill_once_training)
    finally:
        web.stop()
    assert job.status == JobStatus.SUCCEEDED, job_story(job.pk)
    drill = Drill.objects.get(job=job)
    got = report.recovery(drill)
    story = job_story(job.pk)
    assert InterruptionEvent.objects.filter(instance=drill.instance, kind=InterruptionKind.DRILL).exists(), story
    notice = InterruptionEvent.objects.get(instance=drill.instance, kind=InterruptionKind.NOTICE)
    assert notice.checkpoint_saved is True, story
    assert Checkpoint.objects.filter(job=job, kind=CheckpointKind.NOTICE, instance=drill.instance).exists(), story
    assert got.status == DrillStatus.PASSED, (got, story)
    assert got.notice_seen_at and got.save_committed_at and got.replacement_booted_at, (got, story)
    assert got.training_again_at is not None and got.steps_lost is not None, (got, story)
    assert job.preemptions == 0, story


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_a_drill_of_one_gang_node_hands_the_gang_to_spares_at_the_notice_step(child_env, tmp_path):
    # A 2-node gang (tests/e2e/test_gang.py's trainer): the drill serves node 1's cloud notice
    # now, 30 s before the reclaim; the gang's spares boot meanwhile (docs/spares.md), the
    # whole gang saves one notice step and the spares resume from it.
    web, env, setup = served(child_env, tmp_path, RESPAWN_LOCAL_NOTICE_S="30", RESPAWN_NOTICE_BUDGET_S="10",
                             RESPAWN_HEARTBEAT_TIMEOUT_S=str(gang.HEARTBEAT_TIMEOUT_S),
                             RESPAWN_RECONCILE_INTERVAL_S="0.5")
    # The gang holds for at most 30 - 10 s after the notice: asked for once the gang's first
    # commit is on disk, the drill lands mid-run however loaded the machine.
    steps = gang.NOTICE_STEPS
    member = setup.people["member"]
    job = make_job(setup.team, member.user, nodes=gang.NODES, command=gang.gang_command(steps), total_steps=steps,
                   checkpoint_uri=str(tmp_path / "ckpt"), allowed_clouds=["local"], instance_types=["cpu-small"],
                   validation_model_factory="respawn.examples.tiny:make_model",
                   validation_batch_factory="respawn.examples.tiny:validation_batch")
    try:
        with local_gang_stack(job, env, tmp_path) as (job, vms, worker):
            first = gang.first_gang_training(job, vms, worker)
            ask_for_drill(web, job, member, node=1)
            notice = gang.the_gang_ended_on_one_notice_step(job, first, vms, worker)
            job = gang.run_to_the_end(job, vms, worker)
    finally:
        web.stop()
    story = job_story(job.pk)
    interrupted, spares = gang.two_gangs(job, vms)
    assert [i.pk for i in interrupted] == [i.pk for i in first], story
    # The spares, booted while the old gang trained on, resumed together from that save; the
    # first step either trained came after the old gang had ended.
    old_ended = max(i.ended_at for i in interrupted)
    assert all(s.requested_at < old_ended and s.resume_checkpoint_id == notice.pk for s in spares), story
    for spare in spares:
        assert job.events.filter(message__contains=f"spare instance {spare.pk} promoted").exists(), story
        first_step = MetricPoint.objects.filter(instance=spare, step__gt=notice.step).order_by("time").first()
        assert first_step is None or first_step.time > old_ended, story
    assert interrupted[0].last_step == notice.step, story  # the gang (rank 0 reports its steps) stopped at its save

    drill = Drill.objects.get(job=job)
    got = report.recovery(drill)
    assert drill.instance_id == interrupted[1].pk and got.status == DrillStatus.PASSED, (got, story)
    assert got.steps_lost == 0 and 0 < got.window_s <= 30.0, (got, story)  # the notice's deadline, as served
    moments = [drill.interrupted_at, got.notice_seen_at, got.save_committed_at, got.training_again_at]
    assert None not in moments and moments == sorted(moments), (got, story)
    assert got.replacement_requested_at < got.save_committed_at, (got, story)  # the spare boots before the save
    assert got.replacement_booted_at < got.training_again_at, (got, story)
    assert got.validated_at is not None, (got, story)  # validation is on: the notice save was validated
    assert job.preemptions == 0 and [i.end_reason for i in interrupted] == [EndReason.FENCED, EndReason.PREEMPTED]
    # The spares' boot and restore were the drill's money, apart from spot's (docs/money.md).
    cost = costs.job_cost(job)
    assert [cost.work[i.pk].drill for i in [*interrupted, *spares]] == [False, False, True, True], story
    assert cost.ledger.drill.replacement_boot > 0 and cost.ledger.spot_spent + cost.ledger.drill.total == \
        cost.ledger.spent, cost.ledger
