"""How often a rank replicates its shard to its buddy: every K steps, K chosen from what a
replication is measured to cost, by the rule that chooses the storage tier's interval
from what a save costs (Young/Daly, `policy.daly_interval`).

Daly needs M, the mean time between interruptions that lose work. The trainer is not
told M; it is told the interval τ the control plane chose for a save whose cost C it
measured (each save's stall, as the control plane averages them). Young's optimum
τ = sqrt(2·C·M) gives M = τ²/(2·C) back, and the memory tier's optimum for its own cost
C_r follows: about τ·sqrt(C_r/C). An interval the control plane bounded or a job's
override makes that M approximate; K stays within its bounds either way:

- at least the replication's own time (snapshot to the buddy's verdict), in steps: a
  replication still in flight when the next is due skips it, so a shorter K would only
  skip;
- at most the storage interval in steps: a replica older than the newest checkpoint is
  no use.

Until a storage save is measured M is unknown, and no optimum can be taken: K then spends
at most UNKNOWN_M_STALL_SHARE of training time on the replication's stall (a replication
that stalls training 20 ms, at 0.2 s a step, is made every 10 steps, not every step).

A job's own K (RESPAWN_REPLICA_EVERY_STEPS) is a bound instead, held by `strict_cadence`.

Pure: the caller measures.
"""

from __future__ import annotations

import math

from ..policy import daly_interval

UNKNOWN_M_STALL_SHARE = 0.01


def implied_mtbi_s(interval_s: float, save_cost_s: float) -> float:
    """M for which Young's optimum is `interval_s` at a save cost of `save_cost_s` (> 0)."""
    return interval_s * interval_s / (2 * save_cost_s)


def replica_every_steps(*, replica_cost_s: float, replica_wall_s: float, step_s: float, save_cost_s: float | None,
                        interval_s: float) -> int:
    """K for a replication that costs training `replica_cost_s` (its stall) and takes
    `replica_wall_s` to land, at `step_s` a step, beside storage saves every `interval_s`
    that cost `save_cost_s` each (None: none measured yet, or 0: it cost nothing; either
    way M is unknown, and the stall's share of training time bounds K)."""
    if step_s <= 0:
        raise ValueError(f"step_s must be > 0 (got {step_s})")
    most = max(1, math.floor(interval_s / step_s))
    if not save_cost_s or save_cost_s <= 0:
        every_s = replica_cost_s / UNKNOWN_M_STALL_SHARE
    else:
        every_s = daly_interval(replica_cost_s, implied_mtbi_s(interval_s, save_cost_s))
    return min(most, max(1, math.ceil(max(every_s, replica_wall_s) / step_s)))


def strict_cadence(k: int) -> tuple[int, int]:
    """(period, lag) that hold a job's own K as a bound: replicate every `period` steps, and
    the call `lag` calls after each replication began waits until it has landed. A node
    lost at any step then leaves a whole step at most period + lag = K behind. Every K
    steps with no wait would leave K plus however long a send takes to land (on a loaded
    machine, more than a step); a lag of one lets the send overlap the step after it, so
    a send that lands within a step costs no wait. K = 1 leaves no step to overlap: each
    replication lands before its call returns."""
    if k < 1:
        raise ValueError(f"K must be >= 1 (got {k})")
    return (k - 1, 1) if k > 1 else (1, 0)
