"""Market choice for a job with a deadline: spot, on-demand, or wait for spot.

All three rules share one safety net. `slack` is the time that would be left at the
deadline if the job went on-demand now and stayed there, assuming the worst about
the live spot instance (preempted before it saves again: its unsaved work is redone).
When that slack would not survive until the next decision, the job goes on-demand,
so a deadline is missed only if on-demand itself cannot make it.

- `greedy`: spot whenever it can be had, wait otherwise, on-demand once the safety
  net fires, and on-demand from then on (the "greedy" baseline of "Can't Be Late").
- `uniform_progress`: the Uniform Progress rule of "Can't Be Late" (Wu et al., NSDI
  2024): spot when available; when not, on-demand only while progress is behind the
  straight line from start to deadline; once on on-demand, stay until 2 restart
  overheads ahead of the line.
- `deadline_aware` (ours): spot while the slack covers the expected overhead of
  finishing the rest on spot (waiting for capacity, restarts, lost work; estimated
  from the observed rates), wait for spot while it does, on-demand when it no longer
  does, back to spot when the slack covers it again plus the restarts of moving. It
  never keeps more reserve than even pacing would (it waits whenever Uniform Progress
  would), and it pauses on-demand only when well ahead, because each pause and resume
  costs a restart.
"""

from __future__ import annotations

from dataclasses import dataclass

SPOT = "spot"
ON_DEMAND = "on_demand"
PAUSE_BAND_OF_SLACK = 0.1
"""How far ahead of even progress (as a share of the job's slack) on-demand must be before
it is paused to wait for spot again."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobClock:
    now: float
    started_at: float
    deadline: float
    total_work_s: float
    remaining_work_s: float
    """Work still to do from the current progress (at on-demand speed)."""
    unsaved_work_s: float
    """Progress not yet in a checkpoint: lost if the spot instance goes without notice."""
    running: str | None
    """Market of the live instance, None while waiting."""
    spot_available: bool
    restart_s: float
    checkpoint_cost_s: float
    on_demand_interval_s: float
    decision_period_s: float
    """Time until the policy is asked again (reconcile period, simulator tick)."""


def on_demand_slack(clock: JobClock, *, moving: bool) -> float:
    """Time left at the deadline if the job finished on on-demand from here."""
    remaining = clock.remaining_work_s + (clock.unsaved_work_s if clock.running == SPOT else 0.0)
    needed = remaining * (1 + clock.checkpoint_cost_s / clock.on_demand_interval_s) + clock.checkpoint_cost_s
    if moving:
        needed += clock.restart_s
    return clock.deadline - clock.now - needed


def safety_net(clock: JobClock) -> bool:
    """True when waiting one more decision period off on-demand could miss the deadline."""
    if clock.running == ON_DEMAND:
        return False
    return on_demand_slack(clock, moving=True) < clock.decision_period_s


def greedy(clock: JobClock) -> str | None:
    if clock.running == ON_DEMAND or safety_net(clock):
        return ON_DEMAND
    return SPOT if clock.spot_available else None


def uniform_progress(clock: JobClock) -> str | None:
    if safety_net(clock):
        return ON_DEMAND
    elapsed = (clock.now - clock.started_at) / (clock.deadline - clock.started_at)
    ahead = (clock.total_work_s - clock.remaining_work_s) - clock.total_work_s * elapsed
    if clock.running == ON_DEMAND and ahead < 2 * clock.restart_s:
        return ON_DEMAND
    if clock.spot_available:
        return SPOT
    return ON_DEMAND if ahead < 0 else None


def even_progress_lead(clock: JobClock) -> float:
    """Work (seconds) done beyond the straight line from start to deadline (negative: behind)."""
    elapsed = (clock.now - clock.started_at) / (clock.deadline - clock.started_at)
    return (clock.total_work_s - clock.remaining_work_s) - clock.total_work_s * elapsed


def deadline_aware(clock: JobClock, *, spot_overhead_fraction: float) -> str | None:
    """`spot_overhead_fraction`: expected extra wall time per second of work when relying
    on spot here (waiting for capacity, restarts, lost work), e.g. 0.4 for 40 %.

    The reserve it keeps is never larger than even pacing would keep: it waits for spot
    whenever Uniform Progress would, and also while behind the line if the slack still
    covers the expected spot overhead of the rest; it leaves on-demand for spot as soon as
    either allows; and it pauses on-demand only when well ahead, since each pause and
    resume costs a restart.
    """
    if safety_net(clock):
        return ON_DEMAND
    if clock.running == SPOT:
        return SPOT
    reserve = clock.remaining_work_s * spot_overhead_fraction + clock.decision_period_s
    slack = on_demand_slack(clock, moving=True)
    lead = even_progress_lead(clock)
    if clock.running == ON_DEMAND:
        if clock.spot_available:
            # leaving costs a restart now and one more if the job has to come back
            return SPOT if slack - 2 * clock.restart_s >= reserve or lead >= 2 * clock.restart_s else ON_DEMAND
        band = max(2 * clock.restart_s, PAUSE_BAND_OF_SLACK * (clock.deadline - clock.started_at - clock.total_work_s))
        return None if lead >= band else ON_DEMAND
    if clock.spot_available:
        return SPOT
    return None if slack >= reserve or lead >= 0 else ON_DEMAND
