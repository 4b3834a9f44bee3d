"""A notice launches the replacement at once (issue 20 item 1, docs/spares.md): on the
local provider, with VMs that take seconds to boot, the spare boots and registers while
the noticed VM still trains, the noticed VM then saves and stops, and the spare resumes
from that notice checkpoint; never two trainers on the job's one node slot.

Real processes throughout: gunicorn, a Celery worker and beat, detached local "VMs"
each running the agent, which runs the trainer."""

import sys

import pytest

from jobs.core.choices import EndReason, JobStatus
from jobs.models import Instance, InterruptionEvent, Job, LogChunk, MetricPoint
from jobs.money.downtime import job_downtime
from tests.conftest import WebServer, start_worker_and_beat, wait_until
from tests.e2e.test_local_preemptions import story
from tests.factories import make_job, make_team_with_members

STEPS, STEP_DELAY_S = 1200, 0.03
TRAIN = [sys.executable, "-m", "agents.examples.tiny", "--steps", str(STEPS), "--step-delay", str(STEP_DELAY_S)]


def log_text(instance: Instance) -> str:
    return "\n".join(line for chunk in LogChunk.objects.filter(instance=instance) for line in chunk.lines)


def first_training_beat(instance: Instance):
    resume_step = instance.resume_checkpoint.step if instance.resume_checkpoint else 0
    return MetricPoint.objects.filter(instance=instance, step__gt=resume_step).order_by("time").first()


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_a_notice_boots_the_spare_before_the_old_vm_dies_and_it_resumes_from_the_notice_checkpoint(child_env,
                                                                                                  tmp_path):
    # Each VM gets its notice 25 s after its agent starts, 20 s before it is killed; VMs boot
    # in 2 s. The notice save has a 4 s budget, so a noticed VM may train on for ~14 s while
    # its spare boots. 36 s of training: one or two notices on a quiet machine.
    env = {**child_env, "RESPAWN_LOCAL_MARKET": "every", "RESPAWN_LOCAL_PREEMPT_EVERY_S": "25",
           "RESPAWN_LOCAL_NOTICE_S": "20", "RESPAWN_LOCAL_BOOT_DELAY_S": "2", "RESPAWN_NOTICE_BUDGET_S": "4",
           "RESPAWN_HEARTBEAT_TIMEOUT_S": "5", "RESPAWN_RECONCILE_INTERVAL_S": "1"}
    web = WebServer(env, tmp_path / "web.log").start()
    env["RESPAWN_API_URL"] = web.url
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, command=TRAIN, total_steps=STEPS,
                   checkpoint_uri=str(tmp_path / "ckpt"), checkpoint_interval_s=5.0, allowed_clouds=["local"],
                   instance_types=["cpu-small"], validation_enabled=False)
    worker, beat = start_worker_and_beat(env, tmp_path)
    try:
        wait_until(lambda: Job.objects.get(pk=job.pk).status in JobStatus.TERMINAL, timeout=800,
                   what="the job to finish", proc=worker, interval=0.5, explain=lambda: story(job))
    finally:
        beat.stop()
        worker.stop()
        web.stop()
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, story(job)
    noticed = Instance.objects.filter(job=job, interruptions__kind="notice").distinct().order_by("pk")
    assert noticed.exists(), story(job)
    slot = list(Instance.objects.filter(job=job).order_by("pk"))
    for old in noticed:
        assert old.end_reason == EndReason.PREEMPTED, story(job)
        spare = next(i for i in slot if i.pk > old.pk)
        notice = InterruptionEvent.objects.get(instance=old, kind="notice")
        # Launched on the notice, before the old VM was gone; resumed from the old VM's notice save.
        assert spare.requested_at < old.ended_at, story(job)
        # (A notice in the last steps may meet the trainer's final save instead: resumed from that.)
        resume = spare.resume_checkpoint
        assert resume.instance_id == old.pk and resume.kind in ("notice", "final"), story(job)
        assert notice.checkpoint_saved is True or resume.kind == "final"
        # Never two trainers: the spare's first step came after the old instance ended, and its
        # agent waited, prepared, before starting its trainer from the notice checkpoint.
        assert first_training_beat(spare).time > old.ended_at, story(job)
        text = log_text(spare)
        waited = text.index("spare: prepared; waiting")
        assert text.index(f"resumed from step {spare.resume_checkpoint.step}", waited) > waited, text[-3000:]
        assert "training on while a spare boots" in log_text(old)
        # Every event names the spare's overlap with what it cost.
        assert job.events.filter(message__contains=f"spare instance {spare.pk} promoted").filter(
            message__contains="the price of the overlap").exists()
    assert any(i.resume_checkpoint.kind == "notice" for i in slot if i.resume_checkpoint), story(job)
    # The spare was there when the save was done: neither capacity nor boot is on the path.
    total, downtimes = job_downtime(job.pk, job.finished_at)
    spared = [d for d in downtimes if d.instance_id in {o.pk for o in noticed}]
    assert all(d.parts["capacity"] == 0 for d in spared), spared
    assert any(d.parts["boot"] == 0 for d in spared), spared
    assert 0 < total == pytest.approx(sum(d.total_s for d in spared))
