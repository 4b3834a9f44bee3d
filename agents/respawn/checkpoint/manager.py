"""The checkpoint manager: the one object a training loop calls, whichever writer saves.

As in torchtitan's CheckpointManager, the loop calls the manager after every step, a
policy decides (agents/respawn/checkpoint/policy.py), and a backend writes: the packed
files of `Checkpointer` (agents/respawn/checkpoint/packed.py) or torch.distributed.checkpoint's
of `ShardedCheckpointer` (agents/respawn/checkpoint/sharded.py), both committed by one
sequence (agents/respawn/checkpoint/commit.py). The manager owns what is the same for both:
the stop and checkpoint-now flags (signal handlers only set them), the row the ranks
agree on each step, the interval (the agent's control file changes it), acting on a
stop, and the end.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Protocol

from respawn import protocol, trainer

from . import channel, policy, signals
from .config import DEFAULT_INTERVAL_S, CheckpointConfig, SaveOutcome, notice_deadline
from .distributed import Coordinator
from .errors import ConfigError, NoticeSaveMissed


class Backend(Protocol):
    """What writes a checkpoint. Every rank's backend is called at the same calls, with
    the same agreed table, so every rank takes the same branch."""

    saves_at_any_call: bool
    """Its saves wait for the previous one (never `busy`): a save due by steps, which every
    rank sees at the same call, may start at a call that reads no table."""

    replicas: object | None
    """The memory tier's Replicator (tiers/replicator.py), or None: then `replica_due`
    and `replicate` are never called."""

    def replica_due(self, step: int) -> bool:
        """A replication to the buddy is due by this rank's count (rank 0's decides)."""

    def replicate(self, step: int) -> None:
        """Snapshot and send to the buddy in the background, unless its buffers are taken."""

    def settle_replicas(self, step: int) -> None:
        """Every rank's replica of `step` has landed: the stores may drop the older ones."""

    def hold_replica(self, step: int, stop) -> None:
        """With a job's own K, wait here for a replication begun `lag` calls ago to land
        (or fail), unless `stop()`: the bound on the steps a lost node costs."""

    def progress(self) -> tuple[int, int, int]:
        """This rank's save in flight for its row: (busy, written step, failed step)."""

    def before_decision(self) -> None:
        """First thing in every `save()` call."""

    def settle(self, table: list[list[int]]) -> None:
        """Retire (commit, or give up) the save in flight when the table says every rank is done with it."""

    def busy(self, table: list[list[int]] | None) -> bool:
        """A periodic save is still in flight, as every rank agrees."""

    def start_periodic(self, step: int) -> SaveOutcome:
        """Snapshot now, persist in the background, commit later (`committed` None meanwhile)."""

    def save_now(self, step: int, kind: str, deadline: float | None) -> SaveOutcome:
        """Write and commit (or give up) before returning, ahead of any save in flight."""

    def after_call(self) -> None:
        """Last thing in every `save()` call: the loop's next step begins."""

    def drain(self) -> SaveOutcome | None:
        """Finish the save in flight (every rank together)."""

    def close(self) -> None:
        """Release what the backend holds (hooks), after the last save."""


class CheckpointManager:
    """`save(step)` after every step, `close()` at the end; in a gang every rank calls each together."""

    def __init__(self, config: CheckpointConfig, coord: Coordinator):
        self.config = config
        self.coord = coord
        self.clock = policy.SaveClock(config.every_steps, config.interval_s or DEFAULT_INTERVAL_S, time.monotonic())
        self._control = channel.ControlFile(config.control_file)
        self._stop_seen = False
        self._now_seen = False
        self.should_stop = False
        self.last_outcome: SaveOutcome | None = None
        self.backend: Backend | None = None
        self._restore_signals = lambda: None

    def _start(self, backend: Backend) -> None:
        """The subclass's last step of construction: its backend, then the signal handlers
        (installed last, so a constructor that fails leaves the previous ones)."""
        self.backend = backend
        if self.config.handle_signals:
            self._restore_signals = signals.install(self._on_stop, self._on_checkpoint_now)

    # --- flags and run-time settings ---------------------------------------------------------
    def _on_stop(self, signum, frame) -> None:
        self._stop_seen = True  # only a flag: the save happens at the next safe point

    def _on_checkpoint_now(self, signum, frame) -> None:
        self._now_seen = True

    def request_stop(self) -> None:
        """Same as SIGTERM: notice save at the next `save()` call, then `should_stop`."""
        self._stop_seen = True

    def request_checkpoint(self) -> None:
        """Same as SIGUSR1: a save at the next `save()` call."""
        self._now_seen = True

    def set_interval(self, seconds: float) -> None:
        if seconds <= 0:
            raise ConfigError(f"checkpoint interval must be > 0 seconds, got {seconds}")
        self.clock.interval_s = seconds

    @property
    def interval_s(self) -> float:
        return self.clock.interval_s

    # --- the per-step entry point ------------------------------------------------------------
    def save(self, step: int, kind: str | None = None, deadline: float | datetime | None = None) -> SaveOutcome | None:
        """Called after every step. Saves when due or asked (signal, `kind`) and returns
        the outcome of a save started in this call (a periodic one is still in flight:
        `committed` is None), else None. `deadline` (notice saves): epoch seconds or an
        aware datetime; default: the agent's notice file, else `notice_budget_s`."""
        if kind not in (None, *protocol.CheckpointKind.ALL):
            raise ValueError(f"save kind {kind!r} is not one of {protocol.CheckpointKind.ALL}")
        new_interval = self._control.new_interval()
        if new_interval:
            self.clock.interval_s = new_interval
        self.backend.before_decision()
        self._hold_replica(step)
        table = self.coord.agreed(self._row(step))
        if table is not None:
            self.backend.settle(table)
        due_here = self.backend.saves_at_any_call and bool(self.config.every_steps) and self.clock.due(step, time.monotonic())
        decision = policy.decide(step, kind, table, busy=self.backend.busy(table), last_saved_step=self.clock.last_step,
                                 due_here=due_here)
        outcome = self._act(step, kind, decision, deadline)
        if self.backend.replicas is not None and table is not None:
            # Every rank's newest replication landed at or past this step: it is whole on the stores.
            self.backend.settle_replicas(min(row[policy.REPLICATED] for row in table))
            # Every rank at the same call, so the replicas are of one step; and only once every
            # rank's last send has landed: a rank still sending would skip the step alone, the
            # others' stores would move on to it and drop the step it is sending, and no step
            # would be whole on the gang's stores.
            if decision.kind is None and table[0][policy.REPLICA] and not any(row[policy.SENDING] for row in table):
                self.backend.replicate(step)
        self._hold_replica(step)  # a K of 1: before this call returns
        self.coord.share(self._row(step))
        self.backend.after_call()
        return outcome

    def _hold_replica(self, step: int) -> None:
        if self.backend.replicas is not None:
            self.backend.hold_replica(step, lambda: self._stop_seen)

    def _row(self, step: int) -> list[int]:
        due = self.clock.due(step, time.monotonic())
        replicas = self.backend.replicas
        replica = replicas is not None and self.backend.replica_due(step)
        replicated = replicas.landed if replicas is not None else -1
        # A strict K's send is waited for before this rank's next decision: it never holds the gang's.
        sending = replicas is not None and replicas.busy and not replicas.strict
        return [int(self._stop_seen), int(self._now_seen), int(due), *self.backend.progress(), int(replica), replicated,
                int(sending)]

    def _act(self, step: int, asked: str | None, decision: policy.Decision, deadline) -> SaveOutcome | None:
        if decision.kind is None:
            return None
        if not decision.now:
            self._now_seen = False
            self.last_outcome = self.backend.start_periodic(step)
            return self.last_outcome
        if decision.stop and not self.should_stop:
            # A gang's other ranks stop because one rank was asked to: their agents
            # learn from this that the trainer's exit 0 is a stop, not the end of training.
            trainer.report(step, force=True, stopped=True)
        self._stop_seen = False
        self.should_stop = self.should_stop or decision.stop
        self.last_outcome = outcome = self.backend.save_now(step, decision.kind, self._deadline(deadline, decision.kind))
        if asked is None and not outcome.committed:
            # A stop's save that did not commit is a missed notice: the loop must not end
            # as if it had stopped cleanly (docs/signals.md).
            raise NoticeSaveMissed(outcome.message)
        return outcome

    def _deadline(self, deadline: float | datetime | None, kind: str) -> float | None:
        """A notice deadline as monotonic time: given, else `notice_deadline(config)`."""
        if kind == protocol.CheckpointKind.FINAL and deadline is None:
            return None
        if deadline is None:
            return notice_deadline(self.config)
        if isinstance(deadline, datetime):
            deadline = deadline.timestamp()
        return time.monotonic() + deadline - time.time()

    # --- the end -----------------------------------------------------------------------------
    def close(self) -> None:
        """Finish the save in flight (every rank together) and restore the previous signal handlers."""
        try:
            self.backend.drain()
            self.coord.close()
        finally:
            self._restore_signals()
            self.backend.close()

    def resumed_at(self, step: int) -> None:
        """The loop continues from committed checkpoint `step`: the next periodic save is
        an interval (or `every_steps`) from now."""
        self.clock.saved(step, time.monotonic())
