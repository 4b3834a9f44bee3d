"""When to save: the one save policy of both checkpointers (agents/respawn/checkpoint/manager.py).

The loop calls the manager after every step; this module decides, from what the
ranks agreed (agents/respawn/checkpoint/distributed.py), whether that call saves and how:
a periodic save persisted in the background, or a save made before the call returns
(a notice at a stop, a final save). The backends only write. Pure: no clock, no
storage, no torch; the caller passes the time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from respawn.protocol import CheckpointKind

# Columns of the row each rank shares: its flags (stop seen, checkpoint-now seen, a
# periodic save due by its clock), whether a save of its is in flight, the step of that
# save once this rank's part of it is written (or has failed), else -1; with the memory
# tier, a replication to its buddy due by its count (rank 0's decides for the gang, as for
# saves), the step of its newest replication landed on both its stores (else -1) and
# whether a replication of its is still being sent: the manager acts on those three, not
# `decide`.
STOP, NOW, DUE, BUSY, WRITTEN_STEP, FAILED_STEP, REPLICA, REPLICATED, SENDING = range(9)
NOT_YET = -1


@dataclass(frozen=True)
class Decision:
    kind: str | None
    """The save this call makes (a CheckpointKind), or None."""
    now: bool = False
    """Written and committed (or given up) before the call returns: a notice or final save."""
    stop: bool = False
    """A rank saw a stop: the loop ends after this save."""


NONE = Decision(None)


def due(step: int, last_saved_step: int, elapsed_s: float, *, every_steps: int | None, interval_s: float) -> bool:
    """A periodic save is due: `every_steps` steps since the last save when set (the same
    on every rank at the same call), else `interval_s` seconds since it (this rank's clock)."""
    if every_steps:
        return step - last_saved_step >= every_steps
    return elapsed_s >= interval_s


def decide(step: int, asked: str | None, table: list[list[int]] | None, *, busy: bool, last_saved_step: int,
           due_here: bool = False) -> Decision:
    """What this `save(step, kind=asked)` call does. `table` is the rows the ranks agreed
    on (None on a gang's calls that read none); `busy`, whether a periodic save is still
    in flight as every rank agrees; `due_here`, a periodic save due by steps, which a
    backend whose saves wait for the previous one may act on without a table.

    A stop on any rank, or an asked notice or final save, saves now (the caller's kind
    wins; a stop's is a notice). A periodic save is made when asked, due (rank 0's clock
    decides for the gang) or requested (SIGUSR1 on any rank), unless one is in flight (it
    is deferred to the first call after it) or this step is saved already."""
    stop = table is not None and any(row[STOP] for row in table)
    if stop or asked in (CheckpointKind.NOTICE, CheckpointKind.FINAL):
        return Decision(asked or CheckpointKind.NOTICE, now=True, stop=stop)
    wanted = asked == CheckpointKind.PERIODIC or due_here or (
        table is not None and (any(row[NOW] for row in table) or bool(table[0][DUE])))
    if wanted and not busy and step != last_saved_step:
        return Decision(CheckpointKind.PERIODIC)
    return NONE


def all_done(table: list[list[int]], step: int) -> bool:
    """Every rank's part of the save of `step` is written or has failed."""
    return all(step in (row[WRITTEN_STEP], row[FAILED_STEP]) for row in table)


def daly_interval(cost_s: float, mtbi_s: float) -> float:
    """Daly's higher-order optimum for checkpoint cost C and mean time between interruptions M
    (DESIGN §9): the control plane's storage interval (respawn_server.jobs.fleet.policies.interval)
    and the memory tier's K (tiers/pacing.py) both come from it."""
    if math.isinf(mtbi_s):
        return math.inf
    if cost_s >= 2 * mtbi_s:
        return mtbi_s
    ratio = cost_s / (2 * mtbi_s)
    return math.sqrt(2 * cost_s * mtbi_s) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - cost_s


class SaveClock:
    """When the state was last saved (a save begun), the one thing `due` needs to remember."""

    def __init__(self, every_steps: int | None, interval_s: float, now: float):
        self.every_steps = every_steps
        self.interval_s = interval_s
        self.last_step = 0
        self.last_at = now

    def saved(self, step: int, now: float) -> None:
        self.last_step, self.last_at = step, now

    def overdue(self, step: int) -> None:
        """The state at `step` is in no storage: the first save call after it saves."""
        self.last_step, self.last_at = step - (self.every_steps or 0), -math.inf

    def due(self, step: int, now: float) -> bool:
        return due(step, self.last_step, now - self.last_at, every_steps=self.every_steps, interval_s=self.interval_s)
