"""A rank's side of the memory tier in a training loop: at most one replication in flight,
in a thread of its own, to its own node's store (which outlives the trainer: a regroup
kills it) and then to its buddy's, and what the replications cost (tiers/pacing.py turns that
into K).

The packed writer (agents/respawn/checkpoint/packed.py) hands it a shard-building
callable once its snapshot is taken: the thread completes the snapshot (the optimizer's
next step waits for that part), then sends at the lowest CPU priority, as a paced persist
writes: a loop that leaves no core idle starves it, and K, measured, grows. A job that
fixes K (RESPAWN_REPLICA_EVERY_STEPS) asks for at most K steps lost instead: its sends
run at normal priority, sharing the cores with training (a starved send would skip every
replication after it), every K - 1 steps, and the step after each waits for it to land
(`strict`, pacing.strict_cadence), so the bound holds however long a send takes. A
replication due while one is in flight is skipped, never queued: the next one carries a
newer step anyway. A save (storage first) that wants the buffers cancels one in flight
(`give_up`): its own snapshot is replicated next. A failed one is said on stderr and leaves the buddy's
previous replica served; training goes on, the storage tier still holds its checkpoints.
"""

from __future__ import annotations

import sys
import threading
import uuid
import time
from collections.abc import Callable

from ..config import CheckpointConfig
from ..distributed import Coordinator
from ..persist import lower_priority
from . import wire
from .client import ReplicaUnavailable, replicate, settle
from .pacing import replica_every_steps, strict_cadence
from .shard import Ring, Shard, Store


def gang_ring(coord: Coordinator, config: CheckpointConfig) -> Ring | None:
    """The gang's nodes round the ring, or None (a rank without a store, or a node's ranks
    not consecutive as torchrun numbers them: then the gang has no memory tier, and rank 0
    says why). Every rank's store goes round on the ranks' own group, which the gang has
    anyway: nothing new to ask the control plane, and a regrouped gang's new trainers
    learn the new ring the same way. The ranks that name one store share its node. A ring
    of one node (a spare that took a noticed VM's place, its state handed over into its
    store) only resumes from it: there is no other node to replicate to. Every rank of a
    gang calls it together."""
    mine = (config.memory_tier_addr, config.memory_tier_token) if config.memory_tier_addr else None
    stores = coord.gather_objects(mine) if coord.world_size > 1 else [mine]
    why = _no_ring(stores)
    if why is not None:
        if coord.rank == 0 and any(store is not None for store in stores):
            print(f"respawn checkpoint: no memory tier: {why}", file=sys.stderr)
        return None
    per_node = stores.count(stores[0])
    nodes = [stores[first] for first in range(0, len(stores), per_node)]
    return Ring(tuple(((address.rpartition(":")[0], int(address.rpartition(":")[2])), token)
                      for address, token in nodes), per_node)


def _no_ring(stores: list) -> str | None:
    """Why the ranks' stores, indexed by rank, make no ring; None when they do."""
    if any(store is None for store in stores):
        return "not every node of the gang runs a buddy store"
    per_node = stores.count(stores[0])
    nodes = [stores[first:first + per_node] for first in range(0, len(stores), per_node)]
    if any(node != [node[0]] * per_node for node in nodes) or len({node[0] for node in nodes}) != len(nodes) \
            or len(stores) % per_node:
        return (f"a node's ranks are not consecutive, {per_node} a node as on node 0 (torchrun's layout: "
                "the node's RANK as --node-rank, as the agent's PET_NODE_RANK gives it, and the same "
                "--nproc-per-node on every node)")
    return None


def replicator(coord: Coordinator, config: CheckpointConfig, ring: Ring | None) -> Replicator | None:
    """This rank's Replicator, its puts marked with this run of the gang (rank 0's draw);
    None on a ring of one node, which has no other node to replicate to."""
    if ring is None or len(ring.stores) < 2:
        return None
    gang = coord.gather_objects(uuid.uuid4().hex)[0]
    # Its own node's first: over loopback it lands at once, so a buddy lost mid-put leaves
    # this rank's shard of the step on a node that is left.
    return Replicator(coord.rank, [ring.own(coord.rank), ring.buddy(coord.rank)], config.replica_every_steps, gang,
                      node=ring.node_of(coord.rank))


class Replicator:
    def __init__(self, rank: int, stores: list[Store], every_steps: int | None = None, gang: str = "",
                 silent_s: float | None = None, node: int | None = None):
        self.rank = rank
        self.node = rank if node is None else node  # the stores keep a node's ranks: each put names it
        self.silent_s = silent_s  # a store silent this long fails the send (None: wire.PEER_SILENT_S)
        self.gang = gang
        self.stores = stores  # where each replication goes, in order: its own node's, then its buddy's
        self._fixed_every = every_steps
        self.started_step = 0  # of the last replication begun (or, at a resume, the step resumed from)
        self.replicated_step: int | None = None  # the newest step both stores verified
        self.settled_step = -1  # the newest step the gang said is whole on the stores
        self.skipped = 0
        self.cost_s: float | None = None  # the last measured replication's stall of training
        self.wall_s: float | None = None  # the last one's time from its snapshot to the buddy's verdict
        self._thread: threading.Thread | None = None
        self._cancel = wire.Cancel()
        self._to_spare = False

    def hand_over(self, store: Store, node: int) -> None:
        """Send the next replication (a notice save's) to `store` alone, as node `node`'s: a
        spare booted during the notice takes this node's place, and its store is the one
        that outlives this VM (this node's and its buddy's go with a gang handed over whole)."""
        self.stores, self.node, self._to_spare = [store], node, True

    @property
    def where(self) -> str:
        """Where a replication lands, in words."""
        if not self._to_spare:
            return "this node's store and its buddy's"
        (host, port), _ = self.stores[0]
        return f"the spare's store at {host}:{port}"

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def landed(self) -> int:
        """`replicated_step` as a column of the ranks' rows: -1 before any has landed."""
        return -1 if self.replicated_step is None else self.replicated_step

    @property
    def strict(self) -> bool:
        """The job fixed K: a bound on the steps a lost node costs, held by waiting."""
        return self._fixed_every is not None

    @property
    def lag(self) -> int:
        """With a strict K, the call that waits for a replication, counted from the one that began it."""
        return strict_cadence(self._fixed_every)[1] if self.strict else 0

    def wait(self, timeout_s: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

    def settle(self, step: int) -> None:
        """Tell both stores, in the background, that this rank's `step` is whole on the
        gang's: they drop its older replica. A store gone keeps nothing anyway."""
        self.settled_step = step

        def tell() -> None:
            for store in self.stores:
                try:
                    settle(*store, self.rank, step)
                except (ReplicaUnavailable, OSError):
                    pass

        threading.Thread(target=tell, name=f"ckpt-settle-{step}", daemon=True).start()

    def give_up(self) -> None:
        """Cut the replication in flight, if any, between two chunks, and wait for its end."""
        self._cancel.set()
        self.wait()

    def every_steps(self, *, step_s: float | None, save_cost_s: float | None, interval_s: float) -> int:
        """Steps between replications: the period that holds the job's own K
        (RESPAWN_REPLICA_EVERY_STEPS), else K chosen from the last measured replication;
        1 until one is measured (the first replication is its measurement)."""
        if self.strict:
            return strict_cadence(self._fixed_every)[0]
        if self.wall_s is None or self.cost_s is None or not step_s:
            return 1
        return replica_every_steps(replica_cost_s=self.cost_s, replica_wall_s=self.wall_s, step_s=step_s,
                                   save_cost_s=save_cost_s, interval_s=interval_s)

    def start(self, step: int, prepare: Callable[[], Shard], cost_s: Callable[[], float] | None, *,
              idle: bool = True, landed: Callable[[int], None] | None = None) -> bool:
        """Replicate the shard `prepare()` returns (run first thing in the thread), unless one
        is in flight (skipped: False). `cost_s()`, read once the buddy answered, is what it
        cost training; None where the snapshot was a storage save's, whose cost it is.
        `idle`: sent at the lowest CPU priority, as training goes on beside it, unless the
        job fixed K; a notice save's is not (training waits for it, and the window closes).
        `landed(step)`: called in the thread once every store has verified it."""
        if self.busy:
            self.skipped += 1
            return False
        self.started_step = step
        self._cancel = wire.Cancel()
        idle = idle and not self.strict
        thread = threading.Thread(target=self._run, args=(step, prepare, cost_s, idle, landed),
                                  name=f"ckpt-replica-{step}", daemon=True)
        thread.start()
        self._thread = thread  # started first: `wait` may be called from the training thread meanwhile
        return True

    def _run(self, step: int, prepare: Callable[[], Shard], cost_s: Callable[[], float] | None, idle: bool,
             landed: Callable[[int], None] | None) -> None:
        began = time.monotonic()
        try:
            shard = prepare()
            if idle:
                lower_priority()
            cancel = self._cancel
            digests = shard.digests
            for store in self.stores:
                digests = replicate(*store, Shard(shard.rank, shard.step, shard.files, digests, self.gang),
                                    self.silent_s, cancel, node=self.node)
        except ReplicaUnavailable as exc:
            print(f"respawn checkpoint: step {step} not replicated to the buddy: {exc}", file=sys.stderr, flush=True)
            return
        self.replicated_step = step
        if landed is not None:
            landed(step)
        self.wall_s = time.monotonic() - began
        if cost_s is not None:
            self.cost_s = cost_s()
