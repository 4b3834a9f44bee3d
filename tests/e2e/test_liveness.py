"""A job keeps moving while it can (issue 34): on the demo's market, where every spot VM
is reclaimed soon after it boots, it finishes; where spot capacity never comes back, the
job's on-demand fallback finishes it, on the local provider too.

Real processes throughout (gunicorn, Celery worker and beat, local VMs running the agent
and the tiny trainer); the market's clock is the demo's, shortened."""

import json
import sys

import pytest

from respawn_server.jobs.core.choices import EndReason, JobStatus, Market
from respawn_server.jobs.models import Instance, InterruptionEvent
from tests.e2e.stack import MARKET_LIVENESS, run_to_the_end
from tests.factories import make_job, make_team_with_members
from tests.history import job_story

# At least 90 s of training (each step sleeps 30 ms), however fast the machine: VMs reclaimed
# 20 s after boot train less than 20 s each, so at least 4 are reclaimed (1800 steps, 54 s,
# met only 3 on a quiet machine). (10 s VMs, as before, were shorter than a loaded CI machine
# takes to start the trainer: every VM died before its first step, no work was ever kept,
# and spot placement rightly gave up on the job.)
STEPS, STEP_DELAY_S = 3000, 0.03
# Spot capacity gone 6 s into the market: 9 s of training cannot finish on the first spot VM.
FALLBACK_STEPS = 300
# A VM that never registers (seen once on a loaded 2-core machine: an on-demand VM stuck
# booting) is replaced after the provisioning timeout, as anywhere; a minute here, not 15.
NEVER_STUCK_BOOTING = {"RESPAWN_PROVISION_TIMEOUT_S": "60"}


@pytest.fixture
def liveness():
    return MARKET_LIVENESS


def tiny_job(tmp_path, steps=STEPS, **fields):
    setup = make_team_with_members()
    train = [sys.executable, "-m", "respawn.examples.tiny", "--steps", str(steps), "--step-delay", str(STEP_DELAY_S)]
    return make_job(setup.team, setup.people["member"].user, command=train, total_steps=steps,
                    checkpoint_uri=str(tmp_path / "ckpt"), checkpoint_interval_s=2.0, allowed_clouds=["local"],
                    instance_types=["cpu-small"], **fields)


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_a_job_on_the_demos_market_finishes_however_often_its_vms_are_reclaimed(child_env, web_server, tmp_path):
    # The demo's market (every spot VM reclaimed a fixed time after boot, with a notice), its
    # 120 s and 10 s shortened to 20 s and 3 s: each VM trains a few seconds, then saves and goes.
    env = {**child_env, "RESPAWN_API_URL": web_server.url, "RESPAWN_LOCAL_MARKET": "every",
           "RESPAWN_LOCAL_PREEMPT_EVERY_S": "20", "RESPAWN_LOCAL_NOTICE_S": "3", **NEVER_STUCK_BOOTING}
    job = run_to_the_end(tiny_job(tmp_path), env, tmp_path)

    assert job.status == JobStatus.SUCCEEDED, job_story(job.pk)
    assert job.last_step == STEPS
    # More interruptions than the old burst rule (3 an hour in a zone) and rate model allowed,
    # all on spot: placement learnt from the job's own kept work, and never gave up on it.
    spot = Instance.objects.filter(job=job, market=Market.SPOT)
    assert spot.filter(end_reason=EndReason.PREEMPTED).count() >= 4, job_story(job.pk)
    assert not Instance.objects.filter(job=job, market=Market.ON_DEMAND).exists()
    assert InterruptionEvent.objects.filter(instance__job=job, kind="notice", checkpoint_saved=True).exists()


@pytest.mark.e2e
@pytest.mark.store_incidental  # placement's fallback; the demo market's run above shows the stores' locking
@pytest.mark.timeout(900)
def test_where_spot_capacity_never_comes_back_the_on_demand_fallback_finishes_the_job(child_env, web_server,
                                                                                      tmp_path):
    # Every zone's spot capacity: there for the first 6 s of the market, then gone for hours.
    trace = tmp_path / "spot-gone.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 6}, "data": [1] + [0] * 5000}))
    local = {"market_mode": "trace", "market_trace_files": {"*": str(trace)}, "notice_lead_s": 3}
    env = {**child_env, "RESPAWN_API_URL": web_server.url, "RESPAWN_PROVIDER_CONFIG": json.dumps({"local": local}),
           **NEVER_STUCK_BOOTING}
    # The job allows on-demand after 3 preemptions; it meets one, then finds no spot anywhere.
    job = run_to_the_end(tiny_job(tmp_path, FALLBACK_STEPS, on_demand_after_preemptions=3), env, tmp_path)

    assert job.status == JobStatus.SUCCEEDED, job_story(job.pk)
    assert job.last_step == FALLBACK_STEPS
    finisher = Instance.objects.get(job=job, end_reason=EndReason.COMPLETED)
    assert finisher.market == Market.ON_DEMAND and finisher.zone.startswith("local-"), job_story(job.pk)
    assert job.failure_cause == ""
    assert job.preemptions < 3  # it went on-demand because spot had nothing, not for its count
