"""A rank's side of the memory tier in a training loop: at most one replication in flight
to its buddy, in a thread of its own, and what the replications cost (tiers/pacing.py
turns that into K).

The packed writer (agents/respawn/checkpoint/packed.py) hands it a shard-building
callable once its snapshot is taken: the thread completes the snapshot (the optimizer's
next step waits for that part), then sends at the lowest CPU priority, as a paced persist
writes. A replication due while one is in flight is skipped, never queued: the next one
carries a newer step anyway. A failed one is said on stderr and leaves the buddy's
previous replica served; training goes on, the storage tier still holds its checkpoints.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

from ..config import CheckpointConfig
from ..distributed import Coordinator, gather_objects
from ..persist import lower_priority
from .client import ReplicaUnavailable, replicate
from .pacing import replica_every_steps
from .shard import Shard, buddy_of


def join_ring(coord: Coordinator, config: CheckpointConfig) -> Replicator | None:
    """This rank's Replicator, to the next rank's node, or None (alone, or a rank without
    a store: then no rank replicates). The addresses and tokens go round on the ranks' own
    group, which the gang has anyway: nothing new to ask the control plane, and a regrouped
    gang's new trainers learn the new ring the same way. Every rank of a gang calls it
    together (a collective)."""
    if coord.world_size == 1:
        return None
    mine = (config.memory_tier_addr, config.memory_tier_token) if config.memory_tier_addr else None
    stores = gather_objects(coord, mine)
    if any(store is None for store in stores):
        if mine is not None:
            print("respawn checkpoint: no memory tier: not every node of the gang runs a buddy store", file=sys.stderr)
        return None
    address, token = stores[buddy_of(coord.rank, coord.world_size)]
    host, _, port = address.rpartition(":")
    return Replicator(coord.rank, (host, int(port)), token, config.replica_every_steps)


class Replicator:
    def __init__(self, rank: int, buddy: tuple[str, int], token: str, every_steps: int | None = None):
        self.rank = rank
        self.buddy = buddy
        self._token = token
        self._fixed_every = every_steps
        self.started_step = 0  # of the last replication begun (or, at a resume, the step resumed from)
        self.replicated_step: int | None = None  # the newest step the buddy verified
        self.skipped = 0
        self.cost_s: float | None = None  # the last measured replication's stall of training
        self.wall_s: float | None = None  # the last one's time from its snapshot to the buddy's verdict
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def every_steps(self, *, step_s: float | None, save_cost_s: float | None, interval_s: float) -> int:
        """K: the job's own (RESPAWN_REPLICA_EVERY_STEPS), else chosen from the last measured
        replication; 1 until one is measured (the first replication is its measurement)."""
        if self._fixed_every:
            return self._fixed_every
        if self.wall_s is None or self.cost_s is None or not step_s:
            return 1
        return replica_every_steps(replica_cost_s=self.cost_s, replica_wall_s=self.wall_s, step_s=step_s,
                                   save_cost_s=save_cost_s, interval_s=interval_s)

    def start(self, step: int, prepare: Callable[[], Shard], cost_s: Callable[[], float] | None) -> bool:
        """Replicate the shard `prepare()` returns (run first thing in the thread), unless one
        is in flight (skipped: False). `cost_s()`, read once the buddy answered, is what it
        cost training; None where the snapshot was a storage save's, whose cost it is."""
        if self.busy:
            self.skipped += 1
            return False
        self.started_step = step
        self._thread = threading.Thread(target=self._run, args=(step, prepare, cost_s), name=f"ckpt-replica-{step}",
                                        daemon=True)
        self._thread.start()
        return True

    def _run(self, step: int, prepare: Callable[[], Shard], cost_s: Callable[[], float] | None) -> None:
        began = time.monotonic()
        try:
            shard = prepare()
            lower_priority()
            replicate(self.buddy, self._token, shard)
        except ReplicaUnavailable as exc:
            print(f"respawn checkpoint: step {step} not replicated to the buddy: {exc}", file=sys.stderr, flush=True)
            return
        self.replicated_step = step
        self.wall_s = time.monotonic() - began
        if cost_s is not None:
            self.cost_s = cost_s()
