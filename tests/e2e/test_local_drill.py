"""A drill end to end on the local provider (issue 38): a member asks for it on the API,
a Celery worker interrupts the VM through the provider (the market's notice now), the
agent sees the notice and commits its notice save, a spare or relaunch resumes from it and
trains again, the job finishes; the drill passes against its window, and the job's
preemption counter has not moved.

Real processes throughout: gunicorn, a Celery worker and beat, detached local "VMs" each
running the agent, which runs the trainer."""

import sys

import pytest
import requests

from respawn_server.jobs.core.choices import CheckpointKind, DrillStatus, InterruptionKind, JobStatus
from respawn_server.jobs.drills import report
from respawn_server.jobs.models import Checkpoint, Drill, InterruptionEvent, Job, MetricPoint
from tests.conftest import WebServer, wait_until
from tests.e2e.stack import run_to_the_end
from tests.factories import make_job, make_team_with_members
from tests.history import job_story

STEPS, STEP_DELAY_S = 900, 0.03
TRAIN = [sys.executable, "-m", "respawn.examples.tiny", "--steps", str(STEPS), "--step-delay", str(STEP_DELAY_S)]


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_a_drill_with_notice_saves_resumes_and_counts_no_preemption(child_env, tmp_path):
    env = {**child_env, "RESPAWN_LOCAL_MARKET": "none", "RESPAWN_LOCAL_NOTICE_S": "10", "RESPAWN_NOTICE_BUDGET_S": "4",
           "RESPAWN_HEARTBEAT_TIMEOUT_S": "5", "RESPAWN_RECONCILE_INTERVAL_S": "1"}
    web = WebServer(env, tmp_path / "web.log").start()
    env["RESPAWN_API_URL"] = web.url
    setup = make_team_with_members()
    member = setup.people["member"]
    job = make_job(setup.team, member.user, command=TRAIN, total_steps=STEPS, checkpoint_uri=str(tmp_path / "ckpt"),
                   checkpoint_interval_s=30.0, allowed_clouds=["local"], instance_types=["cpu-small"],
                   validation_enabled=False)

    def drill_once_training(worker):
        wait_until(lambda: Job.objects.get(pk=job.pk).status == JobStatus.RUNNING and
                   MetricPoint.objects.filter(job=job, step__gt=50).exists(), timeout=240, what="training",
                   proc=worker, interval=0.5, explain=lambda: job_story(job.pk))
        answer = requests.post(f"{web.url}/api/v1/jobs/{job.pk}/drill/", json={"node": 0}, timeout=30,
                               headers={"Authorization": f"Bearer {member.token}"})
        assert answer.status_code == 202, answer.text

    try:
        job = run_to_the_end(job, env, tmp_path, timeout=500, meanwhile=drill_once_training)
    finally:
        web.stop()
    assert job.status == JobStatus.SUCCEEDED, job_story(job.pk)
    drill = report.refresh(Drill.objects.get(job=job))
    story = job_story(job.pk)
    assert InterruptionEvent.objects.filter(instance=drill.instance, kind=InterruptionKind.DRILL).exists(), story
    notice = InterruptionEvent.objects.get(instance=drill.instance, kind=InterruptionKind.NOTICE)
    assert notice.checkpoint_saved is True, story
    assert Checkpoint.objects.filter(job=job, kind=CheckpointKind.NOTICE, instance=drill.instance).exists(), story
    assert drill.status == DrillStatus.PASSED, (drill.cause, story)
    assert drill.notice_seen_at and drill.save_committed_at and drill.replacement_booted_at, story
    assert drill.training_again_at is not None and drill.steps_lost is not None, story
    assert job.preemptions == 0, story
