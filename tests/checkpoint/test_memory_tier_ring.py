"""The memory tier wired into the packed Checkpointer (agents/respawn/checkpoint/packed.py,
tiers/replicator.py): a gang of three forked ranks, each node's buddy store a process of
its own on loopback, addresses and tokens exchanged on the ranks' own group. What a
user would count on: with the job's K, a step at most K behind is always whole in the next
node's memory (a storage save's persist and a send's landing time included), and what
comes back is bitwise what the rank held at that step."""

from __future__ import annotations

import copy
import json
import socket
import threading
import time

import torch
from torch.utils.data import TensorDataset

from respawn.checkpoint import Checkpointer, ResumableLoader, TrainState
from respawn.checkpoint.tiers import buddy_of, fetch, held_for
from respawn.checkpoint.tiers.replicator import Replicator
from respawn.checkpoint.tiers.restore import state_of
from respawn.checkpoint.tiers.shard import Shard
from respawn.examples import tiny
from respawn.examples.dcp_loop import first_difference

from .conftest import TOKEN, config
from .ranks import run_gang

WORLD, K, STEPS = 3, 4, 30
LOOP_PARTS = ("model", "optimizer", "loader")  # a loop that draws its batches from a DataLoader


def tensors_of(state: dict, parts: tuple[str, ...] = ("model", "optimizer", "scheduler", "sampler")) -> dict:
    """The state's tensors and counters (by default model, optimizer, scheduler, sampler),
    as a resumed rank would restore them (containers as plain dicts and lists: a state
    dict's OrderedDict comes back a dict)."""
    def plain(value):
        if isinstance(value, dict):
            return {key: plain(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(item) for item in value]
        return value
    return plain({part: state[part] for part in parts})


def test_every_k_steps_each_ranks_state_lands_in_the_next_nodes_memory_bitwise(tmp_path, buddies):
    nodes = [buddies(held_for(rank, WORLD), own=rank) for rank in range(WORLD)]
    root = str(tmp_path / "ckpt")

    def body(rank: int) -> None:
        state = tiny.build(rank=rank, world_size=WORLD)  # each rank its own weights: a replica is one rank's
        x, y = tiny.dataset()
        host, port = nodes[rank].address
        ckpt = Checkpointer(state, config(root, every_steps=10, memory_tier_addr=f"{host}:{port}",
                                          memory_tier_token=TOKEN, replica_every_steps=K))
        held, behind = {}, 0
        replicas = ckpt.backend.replicas
        for step in range(STEPS):
            tiny.train_step(state, x, y)
            ckpt.save(step + 1)
            behind = max(behind, step + 1 - (replicas.replicated_step or 0))
            held[step + 1] = copy.deepcopy(tensors_of(state.state_dict()))
            time.sleep(0.02)
        ckpt.close()
        shard = fetch(nodes[buddy_of(rank, WORLD)].address, TOKEN, rank)
        got, meta = state_of(shard)
        (tmp_path / f"rank{rank}.json").write_text(json.dumps({
            "step": shard.step, "meta_step": meta["step"], "replicated": replicas.replicated_step, "behind": behind,
            "difference": first_difference(tensors_of(got), held[shard.step]),
        }))

    assert run_gang(WORLD, body) == [0] * WORLD
    for rank in range(WORLD):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["difference"] is None, (rank, result)
        assert result["step"] == result["meta_step"] == result["replicated"], (rank, result)
        # After every call the newest landed replica was at most K - 1 steps old (the step in
        # progress is the K-th), however busy the machine (tiers/pacing.py strict_cadence).
        assert result["behind"] <= K - 1 and STEPS - (K - 1) <= result["step"] <= STEPS, (rank, result)


def test_two_ranks_a_node_each_ranks_state_lands_in_its_own_and_the_next_nodes_memory_bitwise(tmp_path, buddies):
    """torchrun's layout, `--nproc-per-node 2` on each of 2 nodes: ranks 0-1 on node 0,
    2-3 on node 1; each rank's shard on its own node's store and the other node's."""
    nodes = [buddies(held_for(node, 2), own=node) for node in range(2)]
    root = str(tmp_path / "ckpt")

    def body(rank: int) -> None:
        state = tiny.build(rank=rank, world_size=4)
        x, y = tiny.dataset()
        host, port = nodes[rank // 2].address
        ckpt = Checkpointer(state, config(root, every_steps=10, memory_tier_addr=f"{host}:{port}",
                                          memory_tier_token=TOKEN, replica_every_steps=K))
        held = {}
        for step in range(12):
            tiny.train_step(state, x, y)
            ckpt.save(step + 1)
            held[step + 1] = copy.deepcopy(tensors_of(state.state_dict()))
            time.sleep(0.02)
        ckpt.backend.replicas.wait()
        ckpt.close()
        replicas = [fetch(node.address, TOKEN, rank) for node in (nodes[rank // 2], nodes[buddy_of(rank // 2, 2)])]
        (tmp_path / f"rank{rank}.json").write_text(json.dumps({
            "steps": [shard.step for shard in replicas],
            "differences": [first_difference(tensors_of(state_of(shard)[0]), held[shard.step]) for shard in replicas],
        }))

    assert run_gang(4, body) == [0] * 4
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(4)]
    for rank, result in enumerate(results):
        assert result["differences"] == [None, None], (rank, result)
        assert result["steps"][0] == result["steps"][1] >= 12 - (K - 1), (rank, result)
    assert len({result["steps"][0] for result in results}) == 1, results  # every rank replicates the same steps


def test_a_loop_whose_loader_forks_its_workers_each_epoch_replicates_its_position_bitwise(tmp_path, buddies):
    """A real fine-tuning loop's process tree: each rank's DataLoader forks 2 workers at
    every epoch (3 steps one here), often while a replication is in flight on another
    thread of the rank (the send overlaps a step). Every replica holds the weights and the loader's
    position, workers' included, bitwise as the rank held them at that step."""
    nodes = [buddies(held_for(node, 2), own=node) for node in range(2)]
    root = str(tmp_path / "ckpt")

    def body(rank: int) -> None:
        built = tiny.build(rank=rank, world_size=2)
        x, y = tiny.dataset()
        loader = ResumableLoader(TensorDataset(x[:3 * tiny.BATCH], y[:3 * tiny.BATCH]), tiny.BATCH, seed=rank,
                                 shuffle=True, num_workers=2)
        state = TrainState(built.model, built.optimizer, built.scheduler, loader=loader)
        host, port = nodes[rank].address
        ckpt = Checkpointer(state, config(root, every_steps=10, memory_tier_addr=f"{host}:{port}",
                                          memory_tier_token=TOKEN, replica_every_steps=3))
        held, batches, epochs = {}, iter(loader), 1
        for step in range(18):
            batch = next(batches, None)
            if batch is None:  # a new epoch: its workers are forked now, a replication likely in flight
                batches, epochs = iter(loader), epochs + 1
                batch = next(batches)
            xb, yb = batch
            state.optimizer.zero_grad()
            torch.nn.functional.cross_entropy(state.model(xb), yb).backward()
            state.optimizer.step()
            ckpt.save(step + 1)
            held[step + 1] = copy.deepcopy(tensors_of(state.state_dict(), LOOP_PARTS))
        ckpt.backend.replicas.wait()
        ckpt.close()
        shard = fetch(nodes[buddy_of(rank, 2)].address, TOKEN, rank)
        got = state_of(shard)[0]
        (tmp_path / f"rank{rank}.json").write_text(json.dumps({
            "step": shard.step, "epochs": epochs,
            "difference": first_difference(tensors_of(got, LOOP_PARTS), held[shard.step]),
        }))

    assert run_gang(2, body) == [0, 0]
    for rank in range(2):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["difference"] is None and result["step"] >= 18 - 2 and result["epochs"] == 6, (rank, result)


def test_ranks_all_on_one_node_replicate_nothing(tmp_path, buddies):
    """A ring of one node has no other node to keep its shards (a copy kept only on its
    own node dies with it): its store serves only what was handed over to it."""
    node = buddies(0, own=0)
    assert _tiers(tmp_path, [node, node]) == [False, False]


def test_a_node_whose_ranks_are_not_consecutive_has_no_memory_tier(tmp_path, buddies, capfd):
    """Ranks 0 and 2 on one node, 1 and 3 on the other: not torchrun's --node-rank layout,
    so the stores' node numbers would not be the ranks' (each would refuse the other's)."""
    a, b = buddies(1, own=0), buddies(0, own=1)
    assert _tiers(tmp_path, [a, b, a, b]) == [False] * 4
    assert "no memory tier: a node's ranks are not consecutive" in capfd.readouterr().err


def _tiers(tmp_path, stores) -> list[bool]:
    """Whether each rank of a gang on these stores (by rank) replicates."""
    root, world = str(tmp_path / "ckpt"), len(stores)

    def body(rank: int) -> None:
        host, port = stores[rank].address
        ckpt = Checkpointer(tiny.build(rank=rank, world_size=world),
                            config(root, memory_tier_addr=f"{host}:{port}", memory_tier_token=TOKEN))
        (tmp_path / f"rank{rank}.json").write_text(json.dumps({"tier": ckpt.backend.replicas is not None}))
        ckpt.close()

    assert run_gang(world, body) == [0] * world
    return [json.loads((tmp_path / f"rank{rank}.json").read_text())["tier"] for rank in range(world)]


def test_a_replication_due_while_one_is_in_flight_is_skipped_not_queued():
    with socket.create_server(("127.0.0.1", 0)) as mute:  # a buddy that takes the put and never answers
        store = (mute.getsockname()[:2], TOKEN)
        replicas = Replicator(0, [store, store], every_steps=1)
        shard = Shard(0, 1, {"data-r0-0.bin": torch.zeros(16, dtype=torch.uint8).numpy()}, {})
        assert replicas.start(1, lambda: shard, None)
        assert replicas.busy
        assert not replicas.start(2, lambda: shard, None)
        assert replicas.skipped == 1 and replicas.started_step == 1 and replicas.replicated_step is None


def test_a_send_to_a_store_that_never_answers_ends_once_it_has_been_silent_long_enough():
    """A buddy node gone without a FIN or RST (a reclaimed VM), or a hung store: the send
    fails after `silent_s` (a minute by default), not the kernel's quarter of an hour; a
    job's own K waits for its sends, so training would wait that long too."""
    with socket.create_server(("127.0.0.1", 0)) as mute:  # connects (the backlog), never answers
        store = (mute.getsockname()[:2], TOKEN)
        replicas = Replicator(0, [store, store], every_steps=2, silent_s=0.5)
        shard = Shard(0, 1, {"data-r0-0.bin": torch.zeros(16, dtype=torch.uint8).numpy()}, {})
        assert replicas.start(1, lambda: shard, None)
        replicas.wait(30)
        assert not replicas.busy and replicas.replicated_step is None


def test_a_save_that_wants_the_buffers_cuts_a_send_blocked_on_a_store_that_never_answers_at_once(capfd):
    """A notice save takes the buffers from a replication in flight: a send blocked on a hung
    store (waiting for its answer, or for room in a stream it never reads) must end as the
    save gives it up, not when the store has been silent a minute: the window is seconds.
    Here the silence bound is the default minute, and the give-up returns within seconds."""
    with socket.create_server(("127.0.0.1", 0)) as mute:
        store = (mute.getsockname()[:2], TOKEN)
        replicas = Replicator(0, [store, store], every_steps=2)
        shard = Shard(0, 1, {"data-r0-0.bin": torch.zeros(64 << 20, dtype=torch.uint8).numpy()}, {})
        assert replicas.start(1, lambda: shard, None)
        time.sleep(0.5)  # connected; blocked on the store's go-ahead
        gave_up = threading.Thread(target=replicas.give_up, daemon=True)
        gave_up.start()
        gave_up.join(20)
        assert not gave_up.is_alive() and not replicas.busy and replicas.replicated_step is None
    assert "put of step 1 given up: a save took its buffers" in capfd.readouterr().err


def test_a_save_that_wants_the_buffers_gives_up_a_send_still_connecting_to_a_node_that_never_answers(capfd):
    """A connect to a node gone without a word gets no answer (its SYNs are dropped, as a
    full accept queue drops them here): the save gives it up where it stands, rather than
    after the connect's own timeout, which the message would then name."""
    with socket.create_server(("127.0.0.1", 0), backlog=0) as full:
        filler = socket.create_connection(full.getsockname()[:2])  # the queue's one place: later SYNs are dropped
        store = (full.getsockname()[:2], TOKEN)
        replicas = Replicator(0, [store, store], every_steps=2)
        shard = Shard(0, 1, {"data-r0-0.bin": torch.zeros(16, dtype=torch.uint8).numpy()}, {})
        assert replicas.start(1, lambda: shard, None)
        time.sleep(0.5)  # connecting
        replicas.give_up()
        filler.close()
        assert not replicas.busy and replicas.replicated_step is None
    assert "put of step 1 given up: a save took its buffers (while connecting)" in capfd.readouterr().err
