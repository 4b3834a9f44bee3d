"""K, how often a rank replicates to its buddy (agents/respawn/checkpoint/tiers/pacing.py):
the storage interval's rule (Young/Daly) applied to the memory tier's measured cost,
within the replication's own time and the storage interval; and that cost as measured, the
steps slowed beside a replication in flight included."""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
from contextlib import contextmanager

import pytest
import torch

from respawn.checkpoint import Checkpointer, TrainState, layout, manifest
from respawn.checkpoint.policy import daly_interval
from respawn.checkpoint.storage import open_storage
from respawn.checkpoint.tiers import BuddyServer, held_for
from respawn.checkpoint.tiers.pacing import implied_mtbi_s, replica_every_steps, strict_cadence
from respawn.checkpoint.tiers.replicator import Replicator
from respawn.checkpoint.tiers.shard import Shard
from respawn.examples import tiny

from .conftest import TOKEN, config
from .ranks import run_gang


def k(cost_s=0.05, wall_s=0.5, step_s=0.1, save_cost_s=5.0, interval_s=600.0) -> int:
    return replica_every_steps(replica_cost_s=cost_s, replica_wall_s=wall_s, step_s=step_s, save_cost_s=save_cost_s,
                               interval_s=interval_s)


def test_k_is_the_daly_optimum_for_the_replications_cost_at_the_m_the_storage_interval_implies():
    # A 5 s save every 600 s implies M = 600² / 10 = 36000 s; a replication costing 0.05 s
    # of training is worth making about every 600 * sqrt(0.05 / 5) = 60 s: 600 steps of 0.1 s.
    assert implied_mtbi_s(600.0, 5.0) == 36000.0
    optimum = daly_interval(0.05, 36000.0)
    assert 59 < optimum < 61
    assert k() == math.ceil(optimum / 0.1)


def test_a_cheaper_replication_is_made_more_often_and_a_dearer_one_less():
    assert k(cost_s=0.005) < k(cost_s=0.05) < k(cost_s=0.5)


def test_k_is_never_shorter_than_a_replication_takes_to_land():
    # Sent in 30 s, a replication every 3 s would only be skipped: every 300 steps.
    assert k(cost_s=0.0001, wall_s=30.0) == 300


def test_k_is_never_longer_than_the_storage_interval():
    assert k(cost_s=50.0, save_cost_s=5.0) == 6000  # 600 s of 0.1 s steps: a replica older than a checkpoint is no use


def test_without_a_measured_save_k_keeps_the_replications_stall_to_a_hundredth_of_training():
    # M unknown: no optimum. A stall of 0.05 s every 5 s of steps is 1 % of training time.
    assert k(save_cost_s=None, cost_s=0.05, wall_s=0.45) == 50
    assert k(save_cost_s=0.0, cost_s=0.05, wall_s=0.45) == 50  # a save that cost nothing says nothing of M either
    # A stall of nothing: the replication's own time, as ever, bounds it.
    assert k(save_cost_s=None, cost_s=0.0001, wall_s=0.45) == 5
    assert k(save_cost_s=None, cost_s=50.0, interval_s=600.0) == 6000  # and the storage interval


def test_k_needs_a_step_time():
    with pytest.raises(ValueError, match="step_s"):
        k(step_s=0.0)


def test_a_jobs_own_k_is_held_by_replicating_a_step_sooner_and_waiting_one_step_for_the_landing():
    # Every K - 1 steps, the call after each waits: lost at most (K - 1) + 1. K = 1: every
    # step, landed before its call returns.
    assert [strict_cadence(k) for k in (1, 2, 5, 30)] == [(1, 0), (1, 1), (4, 1), (29, 1)]
    with pytest.raises(ValueError):
        strict_cadence(0)


def test_a_jobs_own_k_wins_and_until_a_replication_is_measured_the_next_step_replicates():
    nowhere = (("127.0.0.1", 1), "t")
    mine = Replicator(0, [nowhere, nowhere], every_steps=7)
    assert mine.every_steps(step_s=0.1, save_cost_s=5.0, interval_s=600.0) == 6 and mine.strict and mine.lag == 1
    chosen = Replicator(0, [nowhere, nowhere])
    assert chosen.every_steps(step_s=0.1, save_cost_s=5.0, interval_s=600.0) == 1
    chosen.cost_s, chosen.wall_s = 0.05, 0.5
    assert chosen.every_steps(step_s=0.1, save_cost_s=5.0, interval_s=600.0) == k()


class HeldAnswers:
    """A store's address whose answers wait until `release()`: every byte a rank sends
    reaches the real store at once, its verdict comes back only then, so the replication
    stays in flight (a slow buddy link) for as many steps as the test likes."""

    def __init__(self, store: BuddyServer):
        self.store, self.released = store, threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def address(self) -> str:
        return "127.0.0.1:%d" % self.listener.getsockname()[1]

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.release()
        self.listener.close()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            upstream = socket.create_connection(self.store.address)
            threading.Thread(target=self._pump, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, self.released), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, gate: threading.Event | None) -> None:
        while data := src.recv(1 << 16):
            if gate is not None:
                gate.wait()
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)


@contextmanager
def stores_with_one_late(world: int, late: int, *, after_s: float = 0.0):
    """Each rank's node's store, node `late`'s answers held: yields the stores' addresses by
    rank and a pipe's write end, through which a forked rank has the test process release
    them `after_s` later."""
    stores = [BuddyServer(held_for(rank, world), TOKEN, own=rank).start() for rank in range(world)]
    held = HeldAnswers(stores[late])
    release_r, release_w = os.pipe()

    def release() -> None:
        os.read(release_r, 1)
        time.sleep(after_s)
        held.release()

    threading.Thread(target=release, daemon=True).start()
    try:
        yield [held.address if rank == late else "%s:%d" % store.address for rank, store in enumerate(stores)], release_w
    finally:
        held.close()
        for store in stores:
            store.close()


def test_what_the_steps_beside_a_replication_lose_is_counted_in_its_cost(tmp_path):
    """The replication's stall, from which K is chosen, is its snapshot's blocking part and
    what the steps it ran beside lost against the step time without one (they share the
    host's cores and memory bandwidth with its send). Here each step beside it is made
    EXTRA_S longer: its cost must hold those seconds, not just its snapshot's."""
    extra_s, slowed_steps = 0.3, 3

    def body(rank: int) -> None:
        state, (x, y) = tiny.build(), tiny.dataset()
        ckpt = Checkpointer(state, config(str(tmp_path / "ckpt"), every_steps=1000, memory_tier_addr=addresses[rank],
                                          memory_tier_token=TOKEN))  # K chosen: a job's own K would wait for the landing
        replicas, slowed = ckpt.backend.replicas, 0
        for step in range(12):
            tiny.train_step(state, x, y)
            time.sleep(0.02)
            if replicas.busy:
                time.sleep(extra_s)
                slowed += 1
            ckpt.save(step + 1)
            if slowed == slowed_steps:
                break
        if rank == 0:
            os.write(release_w, b"x")
        replicas.wait()  # the first replication lands: its cost is measured now
        (tmp_path / f"r{rank}.json").write_text(json.dumps({"slowed": slowed, "cost_s": replicas.cost_s}))
        ckpt.close()

    with stores_with_one_late(2, 1) as (addresses, release_w):  # node 1: both ranks' replications pass through it
        assert run_gang(2, body) == [0, 0]
    for rank in range(2):
        seen = json.loads((tmp_path / f"r{rank}.json").read_text())
        assert seen["slowed"] == slowed_steps, seen
        # Without the after-effect its cost is the snapshot's few milliseconds.
        assert seen["cost_s"] >= 0.8 * slowed_steps * extra_s, seen


@pytest.mark.parametrize("own_k, policy", [(None, os.SCHED_IDLE), (5, os.SCHED_OTHER)], ids=["chosen-k", "jobs-own-k"])
def test_a_jobs_own_k_is_sent_at_normal_priority_and_a_chosen_one_at_idle_priority(own_k, policy):
    """A job that fixes K asks for at most K steps lost: its send shares the cores with
    training rather than wait for an idle one (a starved send skips every replication due
    behind it, and the bound silently breaks). A K chosen from the cost sends at idle
    priority: what it costs training is what K is chosen from."""
    stores = [BuddyServer(held_for(rank, 2), TOKEN, own=rank).start() for rank in range(2)]
    held = HeldAnswers(stores[0])  # rank 0's own node, sent to first: the send waits there
    sender = {}

    def prepare() -> Shard:
        sender["tid"] = threading.get_native_id()
        return Shard(0, 1, {"data-r0-0.bin": os.urandom(4096)}, {})

    try:
        replicas = Replicator(0, [(held.listener.getsockname(), TOKEN), (stores[1].address, TOKEN)], every_steps=own_k)
        assert replicas.start(1, prepare, None)
        time.sleep(0.5)  # the shard sent, its verdict held: the send's thread waits with its priority set
        assert replicas.busy
        assert os.sched_getscheduler(sender["tid"]) == policy
        held.release()
        replicas.wait(30)
        assert replicas.replicated_step == 1
    finally:
        held.close()
        for store in stores:
            store.close()


def test_while_one_ranks_replication_is_still_sending_no_rank_starts_the_next(tmp_path):
    """A gang of three, K chosen from the cost, whose node 2 answers late: ranks 1 (its
    buddy is node 2) and 2 (its own store) are still sending when the next replication is
    due. Rank 0 must not go on alone: its stores would move on to steps the others never
    sent and drop the one they are sending, and no step would be whole on the gang's
    stores. So every rank starts the same replications, at the same steps, and none starts
    another until node 2 answers. (Whether one follows within the run depends on the K
    that rank 0's measured cost chooses: under load, more steps than the run has.)"""
    world, steps, release_at = 3, 30, 8

    def body(rank: int) -> None:
        state, (x, y) = tiny.build(), tiny.dataset()
        ckpt = Checkpointer(state, config(str(tmp_path / "ckpt"), every_steps=1000, memory_tier_addr=addresses[rank],
                                          memory_tier_token=TOKEN))
        replicas, started = ckpt.backend.replicas, []
        for step in range(steps):
            tiny.train_step(state, x, y)
            time.sleep(0.05)
            ckpt.save(step + 1)
            if replicas.started_step not in started[-1:]:
                started.append(replicas.started_step)
            if rank == 0 and step + 1 == release_at:
                os.write(release_w, b"x")
        replicas.wait()
        (tmp_path / f"r{rank}.json").write_text(json.dumps({"started": started, "landed": replicas.replicated_step}))
        ckpt.close()

    with stores_with_one_late(world, 2) as (addresses, release_w):
        assert run_gang(world, body) == [0] * world
    seen = [json.loads((tmp_path / f"r{rank}.json").read_text()) for rank in range(world)]
    started = seen[0]["started"]
    assert all(s["started"] == started for s in seen), seen
    # The first replication (started_step goes 0 -> 2) was held until step 8: no rank began
    # another before it landed; any after it, every rank began together (the lists are equal).
    assert started[1] < release_at and all(step >= release_at for step in started[2:]), seen
    assert len({s["landed"] for s in seen}) == 1, seen


def test_a_jobs_own_k_holds_when_a_replication_takes_many_steps_to_land(tmp_path):
    """A gang of three whose node 2 answers a second late, at 0.05 s a step: twenty steps
    of sends. With the job's K = 3, a node lost at any step must leave a step at most 3
    behind whole on the stores: so after every save() call each rank's newest landed
    replication is at most K - 1 steps old (the step in progress is the K-th). Without the
    wait the ranks trained on and their newest landed replication fell ~20 steps behind."""
    world, k, steps = 3, 3, 24

    def body(rank: int) -> None:
        state, (x, y) = tiny.build(), tiny.dataset()
        ckpt = Checkpointer(state, config(str(tmp_path / "ckpt"), every_steps=1000, memory_tier_addr=addresses[rank],
                                          memory_tier_token=TOKEN, replica_every_steps=k))
        replicas, behind, told = ckpt.backend.replicas, {}, False
        for step in range(1, steps + 1):
            tiny.train_step(state, x, y)
            time.sleep(0.05)
            ckpt.save(step)
            if rank == 0 and replicas.started_step and not told:  # the first has begun: answered a second later
                told = os.write(release_w, b"x")
            behind[step] = step - (replicas.replicated_step or 0)
        (tmp_path / f"r{rank}.json").write_text(json.dumps(behind))
        ckpt.close()

    with stores_with_one_late(world, 2, after_s=1.0) as (addresses, release_w):
        assert run_gang(world, body) == [0] * world
    for rank in range(world):
        behind = json.loads((tmp_path / f"r{rank}.json").read_text())
        assert max(behind.values()) <= k - 1, (rank, behind)


def test_a_jobs_own_k_holds_while_a_paced_storage_save_is_writing(tmp_path, buddies):
    """A periodic save's persist is paced over the interval and holds the snapshot buffers
    meanwhile; a replication due then used to be dropped, for as long as the persist ran
    (half an interval by default: here about as long as the interval, 12 steps). With
    the job's K = 3 the persist is finished at full speed instead and the replication made:
    after every save() call each rank's newest landed replication is at most K - 1 old."""
    world, k, steps = 2, 3, 40
    nodes = [buddies(held_for(rank, world), own=rank) for rank in range(world)]

    def body(rank: int) -> None:
        torch.manual_seed(rank)
        model = torch.nn.Linear(1024, 4096)  # 48 MiB with Adam's moments: 3 paced chunks a file
        state = TrainState(model, torch.optim.Adam(model.parameters(), lr=1e-4))
        host, port = nodes[rank].address
        ckpt = Checkpointer(state, config(str(tmp_path / "ckpt"), every_steps=12, pace_fraction=1.0, validation=None,
                                          memory_tier_addr=f"{host}:{port}", memory_tier_token=TOKEN,
                                          replica_every_steps=k))
        replicas, behind, x = ckpt.backend.replicas, {}, torch.randn(8, 1024)
        for step in range(1, steps + 1):
            state.optimizer.zero_grad()
            model(x).square().mean().backward()
            state.optimizer.step()
            time.sleep(0.03)
            ckpt.save(step)
            behind[step] = step - (replicas.replicated_step or 0)
        (tmp_path / f"r{rank}.json").write_text(json.dumps(behind))
        ckpt.close()

    assert run_gang(world, body) == [0] * world
    for rank in range(world):
        behind = json.loads((tmp_path / f"r{rank}.json").read_text())
        assert max(behind.values()) <= k - 1, (rank, behind)


def test_a_notice_save_commits_to_storage_within_its_window_when_a_store_never_answers(tmp_path):
    """A notice save's commit waits for its replica (mostly the faster tier) so the manifest
    can record both tiers, but never more than half the window left: with node 2's store
    never answering, the notice save still commits within its 3 s, and its manifest says
    the step is in storage only (ranks 1 and 2 have no replica of it on both stores)."""
    world, steps = 3, 6

    def body(rank: int) -> None:
        state, (x, y) = tiny.build(), tiny.dataset()
        ckpt = Checkpointer(state, config(str(tmp_path / "ckpt"), every_steps=1000, memory_tier_addr=addresses[rank],
                                          memory_tier_token=TOKEN, notice_budget_s=3.0))
        for step in range(1, steps + 1):
            tiny.train_step(state, x, y)
            ckpt.save(step)
        outcome = ckpt.save(steps, kind="notice")
        (tmp_path / f"r{rank}.json").write_text(json.dumps({"committed": outcome.committed, "message": outcome.message}))

    with stores_with_one_late(world, 2) as (addresses, _):
        assert run_gang(world, body) == [0] * world
    assert json.loads((tmp_path / "r0.json").read_text()) == {"committed": True, "message": ""}
    assert manifest.read(open_storage(str(tmp_path / "ckpt")), layout.step_dir(steps)).tiers == ("storage",)
