"""The loss curve has every step (issue 34 item 2): on the local provider with the
demo's heartbeat (every 10 s), VMs reclaimed with a notice hand over to their spares, and
every step each trainer reported up to its notice save reaches the control plane; the
curve's mark of each preemption sits at its save's step.

Real processes throughout: gunicorn, a Celery worker and beat, detached local "VMs"
each running the agent, which runs the trainer."""

import sys

import pytest

from respawn_server.frontend import reads, story
from respawn_server.jobs.core.choices import EndReason, JobStatus
from respawn_server.jobs.models import Checkpoint, Instance, StepPoint
from tests.conftest import WebServer
from tests.e2e.stack import run_to_the_end
from tests.factories import make_job, make_team_with_members
from tests.history import job_story

pytestmark = pytest.mark.store_incidental

STEPS, STEP_DELAY_S = 900, 0.03
TRAIN = [sys.executable, "-m", "respawn.examples.tiny", "--steps", str(STEPS), "--step-delay", str(STEP_DELAY_S)]


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_every_step_up_to_each_notice_save_is_on_the_curve_and_marked_at_its_step(child_env, tmp_path):
    # The demo's heartbeat: many steps go by between two heartbeats, so the last ones before a
    # notice save travel only in the agent's final metrics batch.
    env = {**child_env, "RESPAWN_HEARTBEAT_INTERVAL_S": "10", "RESPAWN_HEARTBEAT_TIMEOUT_S": "30",
           "RESPAWN_RECONCILE_INTERVAL_S": "1", "RESPAWN_LOCAL_MARKET": "every",
           "RESPAWN_LOCAL_PREEMPT_EVERY_S": "12", "RESPAWN_LOCAL_NOTICE_S": "6", "RESPAWN_LOCAL_MAX_PREEMPTIONS": "2"}
    web = WebServer(env, tmp_path / "web.log").start()  # its heartbeat timeout is the env's, not the fixture's
    try:
        setup = make_team_with_members()
        job = make_job(setup.team, setup.people["member"].user, command=TRAIN, total_steps=STEPS,
                       checkpoint_uri=str(tmp_path / "ckpt"), checkpoint_interval_s=60.0, allowed_clouds=["local"],
                       instance_types=["cpu-small"], validation_enabled=False)
        job = run_to_the_end(job, {**env, "RESPAWN_API_URL": web.url}, tmp_path, timeout=400)
    finally:
        web.stop()
    assert job.status == JobStatus.SUCCEEDED, job_story(job.pk)

    preempted = Instance.objects.filter(job=job, end_reason=EndReason.PREEMPTED).order_by("pk")
    assert preempted.count() == 2, job_story(job.pk)
    marks = {m["instance"]: m["step"] for m in story.loss_marks(reads.curve_instances(job.pk).run())
             if m["kind"] == EndReason.PREEMPTED}
    for instance in preempted:
        save = Checkpoint.objects.get(instance=instance, kind="notice")
        first = instance.resume_checkpoint.step + 1 if instance.resume_checkpoint else 1
        steps = set(StepPoint.objects.filter(instance=instance).values_list("step", flat=True))
        missing = sorted(set(range(first, save.step + 1)) - steps)
        assert not missing, f"instance {instance.pk}: steps {missing[0]}..{missing[-1]} of {first}..{save.step} " \
                            f"missing ({len(missing)})\n{job_story(job.pk)}"
        assert marks[instance.pk] == save.step
    # The whole curve, as the job page reads it: every step of the run, each once kept.
    assert {p[0] for p in reads.loss_points(job.pk, most=10_000).run()} >= set(range(1, STEPS + 1))
