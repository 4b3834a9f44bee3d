"""A small, hand-computed history of one job across a month boundary.

Prices (aws hand-1, hand.gpu1): spot in hand-1a 0.36 $/h from Jan 1, 0.72 $/h
from Mar 1 00:00; on-demand 1.00 $/h region-wide.

Instance A (spot): launched Feb 28 23:00, preempted Mar 1 01:00, 2 h billed:
  Feb 1 h × 0.36 + Mar 1 h × 0.72 = 1.08. Heartbeats 23:10 step 0 … 00:50 step 1000
  = 6000 s / 1000 steps = 6 s/step. Checkpoints at 600 (stall 4 s) and 900 (stall 6 s).
Instance B (spot): resumed from A's step-900 checkpoint, launched Mar 1 02:00, completed
  03:00 at step 1500: 1 h × 0.72 = 0.72. Heartbeats 02:05 step 0 (its agent, before the
  trainer has loaded the checkpoint, as real agents do), 02:10 step 960 … 02:55 step 1500
  = 2700 s / 540 = 5 s/step.
Instance C: requested, capacity error, never launched: not billed.

Kept: B 1500−900 = 600, A 900−0 = 900. Recomputed: B redid 900..1000 = 100.
Baseline: A 900×6 s × 1.00/3600 = 1.50; B 600×5 s = 3000 s → 0.83333333. Σ 2.33333333.
Spent 1.80; savings 0.53333333.
Waste: A boot 600 s × (1.08/7200) = 0.09, stalls 10 s × 1.08/7200 = 0.0015;
  B boot 300 s × 0.72/3600 = 0.06, recomputed 500 s × 0.72/3600 = 0.10. Σ 0.2515.
Months: Feb spent 0.36, baseline 0.75 (half of A's); Mar spent 1.44, baseline
  0.75 + 0.83333333 = 1.58333333. GPU-hours in March: 2.
"""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

from respawn_server.jobs.core.choices import EndReason, InstanceState
from respawn_server.jobs.models import Checkpoint, Instance, InstanceEvent, MetricPoint, PriceQuote
from tests.factories import make_instance, make_job

UTC = dt.UTC
T = lambda *a: dt.datetime(2026, *a, tzinfo=UTC)  # noqa: E731
WHERE = dict(provider="aws", region="hand-1", zone="hand-1a", instance_type="hand.gpu1")


def seed_prices():
    for zone, market, price, at in (("hand-1a", "spot", "0.36", T(1, 1)), ("hand-1a", "spot", "0.72", T(3, 1)),
                                    ("", "on_demand", "1.00", T(1, 1))):
        PriceQuote.objects.create(provider="aws", region="hand-1", zone=zone, instance_type="hand.gpu1",
                                  market=market, usd_per_hour=Decimal(price), observed_at=at)


def launched(job, *, at, ended=None, end_reason="", last_step=0, resume=None, state=None, **fields) -> Instance:
    instance = make_instance(job, state=state or (InstanceState.ENDED if ended else InstanceState.RUNNING),
                             **WHERE, **fields).instance
    Instance.objects.filter(pk=instance.pk).update(requested_at=at - dt.timedelta(minutes=1),
                                                   registered_at=at + dt.timedelta(minutes=2), ended_at=ended,
                                                   end_reason=end_reason, last_step=last_step, resume_checkpoint=resume)
    event = InstanceEvent.objects.create(instance=instance, from_state="requested", to_state="booting")
    InstanceEvent.objects.filter(pk=event.pk).update(created_at=at)
    instance.refresh_from_db()
    return instance


def heartbeats(instance, points):
    MetricPoint.objects.bulk_create([MetricPoint(job_id=instance.job_id, instance=instance, time=t, step=s, loss=1.0)
                                     for t, s in points])


def checkpoint(instance, step, *, at, stall_s):
    return Checkpoint.objects.create(checkpoint_id=uuid.uuid4(), job_id=instance.job_id, instance=instance, step=step,
                                     uri=f"/ckpt/step-{step}", bytes=1, manifest_digest="d", committed_at=at,
                                     stall_s=stall_s)


def make_history(team, owner):
    seed_prices()
    job = make_job(team, owner, total_steps=1500)
    a = launched(job, at=T(2, 28, 23), ended=T(3, 1, 1), end_reason=EndReason.PREEMPTED, last_step=1000)
    heartbeats(a, [(T(2, 28, 23, 10), 0), (T(3, 1, 0, 0), 500), (T(3, 1, 0, 50), 1000)])
    checkpoint(a, 600, at=T(3, 1, 0, 10), stall_s=4.0)
    resume = checkpoint(a, 900, at=T(3, 1, 0, 40), stall_s=6.0)
    b = launched(job, at=T(3, 1, 2), ended=T(3, 1, 3), end_reason=EndReason.COMPLETED, last_step=1500, resume=resume)
    heartbeats(b, [(T(3, 1, 2, 5), 0), (T(3, 1, 2, 10), 960), (T(3, 1, 2, 55), 1500)])
    never = make_instance(job, state=InstanceState.ENDED, **WHERE).instance
    Instance.objects.filter(pk=never.pk).update(end_reason=EndReason.CAPACITY_ERROR, ended_at=T(3, 1, 1, 30))
    return job, a, b, never
