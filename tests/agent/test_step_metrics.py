"""Every step a trainer reports reaches the job's loss curve, not one point per
heartbeat; a resumed VM's log says where it resumed and whether that checkpoint was
found sound. A real agent, a real trainer process and the real control plane."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
from django.utils import timezone

from respawn import protocol
from respawn.agent.channel import MetricsTail
from respawn_server.jobs.core.choices import JobStatus
from respawn_server.jobs.models import Checkpoint, Instance, LogChunk, MetricPoint, StepPoint
from tests.agent.live import AgentProcess
from tests.agent_api.helpers import checkpoint_uri
from tests.conftest import wait_until
from tests.factories import make_instance, make_job

pytestmark = pytest.mark.store_incidental

STEPS = 300
# A trainer that reports every step through the helper library and ends well.
TRAINER = ("import time\nfrom respawn import trainer\nprint('training', flush=True)\n"
           f"for step in range(1, {STEPS} + 1):\n"
           "    trainer.report(step, 2.0 / step, 1000.0)\n"
           "    time.sleep(0.005)\n")


@pytest.mark.e2e
def test_every_reported_step_reaches_the_curve_and_a_resume_is_told_in_the_log(team_setup, child_env, web_server,
                                                                                 tmp_path):
    owner = team_setup.people["admin"].user
    job = make_job(team_setup.team, owner, command=[sys.executable, "-c", TRAINER], total_steps=STEPS,
                   checkpoint_uri=str(tmp_path / "ckpt"), status=JobStatus.PROVISIONING)
    earlier = make_instance(job).instance
    resume = Checkpoint.objects.create(job=job, instance=earlier, checkpoint_id=uuid.uuid4(), step=100,
                                       uri=checkpoint_uri(job, 100), bytes=1, manifest_digest="xxh3-128:1",
                                       validation=protocol.ValidationResult.VALID, committed_at=timezone.now())
    Instance.objects.filter(pk=earlier.pk).update(state="ended", end_reason="preempted")
    setup = make_instance(job)
    agent = AgentProcess(child_env, tmp_path, url=web_server.url, bootstrap_token=setup.bootstrap_token,
                         provider="local", metadata_url="http://127.0.0.1:9").start()
    try:
        wait_until(lambda: Instance.objects.get(pk=setup.instance.pk).end_reason != "", timeout=90,
                   what="the trainer to end and its exit to be reported", proc=agent)
        agent.proc.wait(30)
    finally:
        agent.stop(9)
    steps = list(StepPoint.objects.filter(instance=setup.instance).order_by("step").values_list("step", flat=True))
    assert steps == list(range(1, STEPS + 1)), agent.output()[-3000:]
    assert StepPoint.objects.get(instance=setup.instance, step=4).loss == 0.5
    assert MetricPoint.objects.filter(instance=setup.instance).count() < STEPS  # the heartbeats' points: a few
    lines = [line for chunk in LogChunk.objects.filter(instance=setup.instance) for line in chunk.lines]
    told = [line for line in lines if "resumed from step" in line]
    assert len(told) == 1 and told[0].endswith(f"resumed from step 100 (checkpoint {resume.uri}, validated)"), lines
    assert lines.index(told[0]) < lines.index("training")  # told before the trainer starts


def test_more_steps_than_a_batch_holds_are_thinned_evenly_keeping_the_newest(tmp_path):
    path = tmp_path / "metrics.jsonl"
    many = 2 * protocol.MAX_METRIC_POINTS_PER_BATCH + 501
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0, "samples_per_s": 2.0, "time": 1.7e9 + s}) + "\n"
                            for s in range(1, many + 1)))
    tail = MetricsTail(str(path))
    batch = tail.batch()
    steps = [p.step for p in batch.points]
    assert len(steps) <= protocol.MAX_METRIC_POINTS_PER_BATCH and steps[-1] == many
    assert len({b - a for a, b in zip(steps, steps[1:])}) == 1  # evenly spaced
    assert tail.batch() is None  # read once


def test_unreadable_or_unusable_lines_are_skipped_and_a_diverged_loss_is_none(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": NaN, "time": 1.7e9}\nnot json\n{"step": -2, "time": 1.7e9}\n'
                    '{"step": 3, "loss": 0.5}\n{"step": 4, "loss": 0.25, "samples_per_s": 9, "time": 1.7e9}\n'
                    '{"step": 5, "loss": 0.1, "time"')  # a line still being written
    points = MetricsTail(str(path)).batch().points
    assert [(p.step, p.loss, p.samples_per_s) for p in points] == [(1, None, None), (4, 0.25, 9.0)]
    assert points[1].time.startswith("2023-11-14T22:13:20")


def test_a_script_without_the_library_reports_every_step_the_same_way(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    env = {**os.environ, protocol.ENV_METRICS_FILE: str(metrics), protocol.ENV_CHECKPOINT_URI: str(tmp_path / "ckpt")}
    subprocess.run([sys.executable, "-m", "respawn.examples.plain_pytorch", "--steps", "20"], env=env, check=True,
                   capture_output=True, timeout=120)
    points = MetricsTail(str(metrics)).batch().points
    assert [p.step for p in points] == list(range(1, 21)) and all(p.loss is not None for p in points)
