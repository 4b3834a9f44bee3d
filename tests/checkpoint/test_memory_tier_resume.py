"""A gang regrouped after a node is lost resumes from the memory tier
(agents/respawn/checkpoint/tiers/restore.py, Checkpointer.load_latest): forked ranks,
each node's store in this process (so a test can rot a byte of it), a node lost by
closing its store. Each rank's trainer is gone, as a regroup kills them; the new gang
takes the newest step every rank finds verified in the stores left, when it is newer
than storage's newest checkpoint, bitwise what the old ranks held; otherwise storage."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch

from respawn.checkpoint import Checkpointer, ResumableSampler, TrainState, layout, manifest
from respawn.checkpoint.reader import committed
from respawn.checkpoint.storage import open_storage
from respawn.checkpoint.tiers import BuddyServer, held_for, restore, status
from respawn.checkpoint.validation import Verdict, mark
from respawn.examples import tiny
from respawn.examples.dcp_loop import first_difference

from .conftest import TOKEN, config
from .ranks import run_gang
from .test_memory_tier_ring import tensors_of

K, EVERY, STEPS, GLOBAL_BATCH = 4, 10, 27, 24


def gang_state(rank: int, world: int) -> TrainState:
    """Each rank its own weights; a global batch every size of the gang divides, so a
    state saved by 3 ranks resumes on 2."""
    built = tiny.build(rank=rank, world_size=world)
    sampler = ResumableSampler(tiny.DATASET_SIZE, GLOBAL_BATCH // world, seed=0, rank=rank, world_size=world)
    return TrainState(built.model, built.optimizer, built.scheduler, sampler=sampler)


def progress_of(state: dict) -> dict:
    """What a resume must reproduce: the tensors and counters, the sampler's position in the
    global order but not its per-rank share (a gang of 2 takes 12 samples a rank, not 8)."""
    kept = tensors_of(state)
    kept["sampler"] = {k: v for k, v in kept["sampler"].items() if k not in ("batch_size", "world_size", "rank")}
    return kept


def gang_config(root: str, store: BuddyServer):
    host, port = store.address
    return config(root, every_steps=EVERY, memory_tier_addr=f"{host}:{port}", memory_tier_token=TOKEN,
                  replica_every_steps=K, checkpoints_file=str(Path(root).parent / "checkpoints.jsonl"))


def train_until_lost(tmp_path: Path, stores: list[BuddyServer], *, notice: bool = False, per_node: int = 1) -> None:
    """The first gang (`per_node` ranks on each store's node, as torchrun numbers them)
    trains STEPS steps, each rank keeping what it held at each step, then (`notice`) saves
    the last one on a notice, then its trainers are gone (the replications in flight
    landed)."""
    world, root = len(stores) * per_node, str(tmp_path / "ckpt")

    def body(rank: int) -> None:
        state, (x, y) = gang_state(rank, world), tiny.dataset()
        ckpt = Checkpointer(state, gang_config(root, stores[rank // per_node]))
        for step in range(STEPS):
            tiny.train_step(state, x, y)
            ckpt.save(step + 1)
            torch.save(progress_of(state.state_dict()), tmp_path / f"held-r{rank}-s{step + 1}.pt")
            time.sleep(0.02)  # a step leaves a core idle (a GPU's would): replicas run at idle priority
            # ...and each lands before the next step, however busy the machine is (on a loaded
            # one a send at idle priority starved, a save took its buffers, and no step newer
            # than storage was whole in memory): these tests are of the resume, not the pacing.
            ckpt.backend.replicas.wait()
        if notice:
            assert ckpt.save(STEPS, kind="notice").committed
        ckpt.backend.replicas.wait()

    assert run_gang(world, body) == [0] * world


def regroup(tmp_path: Path, survivors: list[BuddyServer], *, train_on: int = 0, per_node: int = 1) -> list[dict]:
    """The gang of the nodes left, re-numbered in their order, each store told its new ring
    (what the agent does at the trainer's start), then `train_on` steps, each saved as the
    loop would save it: what each rank resumed."""
    world, root = len(survivors) * per_node, str(tmp_path / "ckpt")
    for node, store in enumerate(survivors):
        store.hold_for(held_for(node, len(survivors)), own=node)

    def body(rank: int) -> None:
        state = gang_state(rank, world)
        ckpt = Checkpointer(state, gang_config(root, survivors[rank // per_node]))
        resumed = ckpt.load_latest()
        held = torch.load(tmp_path / f"held-r{rank}-s{resumed.step}.pt", weights_only=False)
        (tmp_path / f"resumed-r{rank}.json").write_text(json.dumps({
            "step": resumed.step, "tier": resumed.tier,
            "difference": first_difference(progress_of(state.state_dict()), held)}))
        x, y = tiny.dataset()
        for step in range(resumed.step, resumed.step + train_on):
            tiny.train_step(state, x, y)
            ckpt.save(step + 1)
        ckpt.close()

    assert run_gang(world, body) == [0] * world
    return [json.loads((tmp_path / f"resumed-r{rank}.json").read_text()) for rank in range(world)]


def newest_in_storage(tmp_path: Path) -> int:
    return committed(open_storage(str(tmp_path / "ckpt")))[-1].step


@pytest.fixture
def stores():
    started = []

    def start(world: int) -> list[BuddyServer]:
        started.extend(BuddyServer(held_for(rank, world), TOKEN, own=rank).start() for rank in range(world))
        return started[-world:]

    yield start
    for store in started:
        store.close()


def test_a_node_lost_the_survivors_resume_the_newest_replicated_step_bitwise_from_memory(tmp_path, stores, capfd):
    nodes = stores(3)
    train_until_lost(tmp_path, nodes)
    nodes[1].close()  # node 1 lost: its store, and rank 1's trainer, with it

    resumed = regroup(tmp_path, [nodes[0], nodes[2]])
    # Replicated every K steps, so at most K steps lost, fewer than storage's newest loses;
    # rank 1 of the new gang resumes the lost rank 1's state, from its buddy, node 2.
    steps = {r["step"] for r in resumed}
    step = steps.pop()
    assert not steps and max(STEPS - K, newest_in_storage(tmp_path) + 1) <= step <= STEPS, resumed
    assert all(r["tier"] == "memory" and r["difference"] is None for r in resumed), resumed
    # Validated before training went on, as a checkpoint from storage is.
    assert f"step {step} from the memory tier: valid (loss " in capfd.readouterr().err


def test_two_ranks_a_node_one_node_lost_the_survivors_resume_its_ranks_from_the_next_nodes_memory(tmp_path, stores, capfd):
    """torchrun's layout, 2 ranks on each of 3 nodes: node 1 takes ranks 2 and 3 with it;
    the gang of the 2 nodes left (ranks 0-3) resumes the old ranks 0-3, the lost node's
    from node 2's store, bitwise, validated."""
    nodes = stores(3)
    train_until_lost(tmp_path, nodes, per_node=2)
    assert sorted({rank for rank, *_ in status(nodes[2].address, TOKEN)["replicas"]}) == [2, 3, 4, 5]
    nodes[1].close()

    resumed = regroup(tmp_path, [nodes[0], nodes[2]], per_node=2)
    steps = {r["step"] for r in resumed}
    step = steps.pop()
    assert not steps and max(STEPS - K, newest_in_storage(tmp_path) + 1) <= step <= STEPS, resumed
    assert all(r["tier"] == "memory" and r["difference"] is None for r in resumed), resumed
    err = capfd.readouterr().err
    assert f"step {step} from the memory tier: valid (loss " in err
    assert "no memory tier" not in err


def test_the_survivors_first_save_after_a_memory_resume_puts_the_gangs_state_in_storage(tmp_path, stores, capfd):
    nodes = stores(3)
    train_until_lost(tmp_path, nodes)
    nodes[1].close()
    before = newest_in_storage(tmp_path)

    resumed = regroup(tmp_path, [nodes[0], nodes[2]], train_on=3)
    # Periodic saves are EVERY steps apart, but the steps kept only in memory are not left
    # there until the next one: the gang's first save call that reads the ranks' agreement
    # (the second after the resume) persists its step.
    step = resumed[0]["step"]
    assert resumed[0]["tier"] == "memory" and step > before, resumed
    assert step < newest_in_storage(tmp_path) <= step + 2 < step + EVERY
    assert f"resumed at step {step} from the memory tier" in capfd.readouterr().err


def rewrite_rank_0s_reference_loss(nodes: list[BuddyServer], change) -> int:
    """Rank 0's newest shard on its own node (the one a resume reads first) with its
    reference loss changed and its digest made to match: intact bytes, wrong content.
    Returns its step."""
    own = nodes[0].replicas[0][-1]
    name = layout.rank_state_file(0)
    meta = json.loads(bytes(own.files[name]))
    meta["reference_loss"] = change(meta["reference_loss"])
    own.files[name] = json.dumps(meta).encode()
    own.digests[name] = manifest.digest_bytes(own.files[name])
    return own.step


def test_a_replica_whose_weights_miss_their_reference_loss_sends_every_rank_to_storage(tmp_path, stores, capfd):
    """Intact bytes of the wrong weights (a snapshot torn by a racing optimizer step would
    be digested as it was sent): the digests pass, the reference loss does not."""
    nodes = stores(3)
    train_until_lost(tmp_path, nodes)
    nodes[1].close()
    step = rewrite_rank_0s_reference_loss(nodes, lambda loss: loss + 1.0)

    resumed = regroup(tmp_path, [nodes[0], nodes[2]])
    assert resumed == [{"step": newest_in_storage(tmp_path), "tier": "storage", "difference": None}] * 2
    err = capfd.readouterr().err
    assert f"step {step} from the memory tier: invalid (" in err and "resuming from storage" in err


def test_a_replica_whose_reference_loss_is_not_a_number_sends_every_rank_to_storage(tmp_path, stores):
    nodes = stores(3)
    train_until_lost(tmp_path, nodes)
    nodes[1].close()
    rewrite_rank_0s_reference_loss(nodes, str)

    resumed = regroup(tmp_path, [nodes[0], nodes[2]])
    assert resumed == [{"step": newest_in_storage(tmp_path), "tier": "storage", "difference": None}] * 2


def test_a_notice_save_lands_in_the_buddys_memory_and_the_survivors_resume_from_it_when_storage_missed_it(
        tmp_path, stores, capfd):
    nodes = stores(3)
    train_until_lost(tmp_path, nodes, notice=True)
    err = capfd.readouterr().err
    # Every rank's, before save() returned.
    assert err.count(f"notice save of step {STEPS}: in the memory tier") == 3, err[-3000:]
    # The window closed before the storage write committed (a bucket slower than the buddy's network).
    shutil.rmtree(tmp_path / "ckpt" / layout.step_dir(STEPS))
    assert newest_in_storage(tmp_path) < STEPS
    nodes[1].close()  # the noticed node goes

    resumed = regroup(tmp_path, [nodes[0], nodes[2]])
    assert resumed == [{"step": STEPS, "tier": "memory", "difference": None}] * 2


def test_a_notice_save_whose_replicas_landed_records_both_tiers_in_its_manifest_and_its_report(tmp_path, stores):
    nodes = stores(3)
    train_until_lost(tmp_path, nodes, notice=True)

    noticed = manifest.read(open_storage(str(tmp_path / "ckpt")), layout.step_dir(STEPS))
    assert noticed.tiers == ("storage", "memory")
    assert json.loads(noticed.raw)["tiers"] == ["storage", "memory"]
    reports = [json.loads(line) for line in (tmp_path / "checkpoints.jsonl").read_text().splitlines()]
    assert [r["tiers"] for r in reports if r["step"] == STEPS] == [["storage", "memory"]]


def test_a_gang_without_the_memory_tier_records_its_checkpoints_in_storage_only(tmp_path):
    root = str(tmp_path / "ckpt")

    def body(rank: int) -> None:
        state, (x, y) = gang_state(rank, 2), tiny.dataset()
        ckpt = Checkpointer(state, config(root, every_steps=EVERY, checkpoints_file=str(tmp_path / "checkpoints.jsonl")))
        for step in range(12):
            tiny.train_step(state, x, y)
            ckpt.save(step + 1)
        assert ckpt.save(12, kind="notice").committed

    assert run_gang(2, body) == [0, 0]
    assert manifest.read(open_storage(root), layout.step_dir(12)).tiers == ("storage",)
    reports = [json.loads(line) for line in (tmp_path / "checkpoints.jsonl").read_text().splitlines()]
    assert {tuple(r["tiers"]) for r in reports} == {("storage",)} and reports[-1]["step"] == 12


def test_storages_newest_step_held_whole_in_the_stores_is_read_from_memory_not_storage(tmp_path, stores, capfd):
    """The noticed node's save committed to storage and landed in the stores: the survivors
    read that step from memory (the faster tier), bitwise, and say which checkpoint it is."""
    nodes = stores(3)
    train_until_lost(tmp_path, nodes, notice=True)
    assert newest_in_storage(tmp_path) == STEPS
    nodes[1].close()
    capfd.readouterr()

    resumed = regroup(tmp_path, [nodes[0], nodes[2]])
    assert resumed == [{"step": STEPS, "tier": "memory", "difference": None}] * 2
    uri = open_storage(str(tmp_path / "ckpt")).url_for(layout.step_dir(STEPS))
    assert capfd.readouterr().err.count(f"the step of storage's newest checkpoint {uri}, read from memory instead") == 2


def test_a_step_recorded_invalid_in_storage_is_not_read_from_memory_either(tmp_path, stores):
    nodes = stores(3)
    train_until_lost(tmp_path, nodes, notice=True)
    storage = open_storage(str(tmp_path / "ckpt"))
    [condemned] = [ref for ref in committed(storage) if ref.step == STEPS]
    mark(condemned, Verdict(False, 1.0, 0.5, "loss 1.0, reference 0.5"))
    before = max(ref.step for ref in committed(storage) if ref.step < STEPS)
    nodes[1].close()

    resumed = regroup(tmp_path, [nodes[0], nodes[2]])
    assert resumed == [{"step": before, "tier": "storage", "difference": None}] * 2


def test_two_neighbours_lost_together_fall_back_to_storage(tmp_path, stores):
    nodes = stores(4)
    train_until_lost(tmp_path, nodes)
    nodes[1].close()
    nodes[2].close()  # rank 1's shard was on both

    resumed = regroup(tmp_path, [nodes[0], nodes[3]])
    assert resumed == [{"step": newest_in_storage(tmp_path), "tier": "storage", "difference": None}] * 2


def test_a_replica_that_fails_its_digest_sends_every_rank_to_storage(tmp_path, stores):
    nodes = stores(3)
    train_until_lost(tmp_path, nodes)
    nodes[1].close()
    lost_ranks_shard = nodes[2].replicas[1][-1]
    next(iter(lost_ranks_shard.files.values()))[100] ^= 0x01  # rot in node 2's memory: the only copy left

    resumed = regroup(tmp_path, [nodes[0], nodes[2]])
    assert resumed == [{"step": newest_in_storage(tmp_path), "tier": "storage", "difference": None}] * 2


def test_the_plan_takes_the_newest_step_whole_from_one_run_its_own_nodes_copy_first():
    held = [[[0, 24, 9, "a"], [2, 24, 9, "a"]],  # node 0: its own shard and rank 2's
            [[1, 24, 9, "a"], [0, 24, 9, "a"]]]  # node 1: its own and rank 0's
    assert restore.plan(held, ranks=2, newer_than=20) == (24, "a", [0, 1])
    assert restore.plan(held, ranks=3, newer_than=20) == (24, "a", [0, 1, 0])  # the lost rank 2's, from its buddy
    assert restore.plan(held, ranks=2, newer_than=24) is None  # not newer than storage's: storage


def test_the_plan_with_two_ranks_a_node_reads_each_rank_from_its_own_node_first():
    # The gang left of 3 nodes x 2 ranks: old nodes 0 and 2 (ranks 0-1, and 4-5 with the
    # lost node's 2-3), now nodes 0 and 1 of 2 ranks each.
    held = [[[0, 24, 9, "a"], [1, 24, 9, "a"], [4, 24, 9, "a"], [5, 24, 9, "a"]],
            [[4, 24, 9, "a"], [5, 24, 9, "a"], [2, 24, 9, "a"], [3, 24, 9, "a"]]]
    assert restore.plan(held, ranks=4, newer_than=20, ranks_per_node=2) == (24, "a", [0, 0, 1, 1])
    assert restore.plan(held[:1], ranks=4, newer_than=20, ranks_per_node=2) is None  # ranks 2-3 only on node 1


def test_a_node_lost_while_its_replication_landed_leaves_the_step_before_whole():
    # The survivors of 3 (old nodes 0 and 2): rank 1's step 24 was on its way to node 2
    # when rank 1's node died; neither store has settled 20 away.
    held = [[[0, 20, 9, "a"], [0, 24, 9, "a"], [2, 20, 9, "a"], [2, 24, 9, "a"]],
            [[2, 20, 9, "a"], [2, 24, 9, "a"], [1, 20, 9, "a"]]]
    assert restore.plan(held, ranks=2, newer_than=16) == (20, "a", [0, 1])


def test_the_plan_never_mixes_two_runs_shards_of_one_step_and_takes_an_older_whole_step():
    held = [[[0, 24, 9, "new"], [0, 22, 9, "old"]],
            [[1, 24, 9, "old"], [1, 22, 9, "old"]]]  # run "new" resumed from storage and counted to 24 again
    assert restore.plan(held, ranks=2, newer_than=20) == (22, "old", [0, 1])
    assert restore.plan(held, ranks=2, newer_than=22) is None


@pytest.mark.parametrize("ranks", [1, 2], ids=["one-rank", "torchrun-two-ranks"])
@pytest.mark.parametrize("storage_missed", [False, True], ids=["storage-committed", "storage-missed-the-window"])
def test_a_notice_save_handed_over_to_a_spare_resumes_there_from_memory_bitwise(tmp_path, ranks, storage_missed, capfd):
    """A job of one node, no tier of its own: a spare booted during the notice, its store
    named in the notice file (the agent writes it there), receives the notice save's
    shards straight from the noticed VM beside the storage write. The spare's trainer
    resumes from its own store: the notice step, bitwise, validated, read from memory
    even when storage holds it too, and from memory alone when storage's write missed
    the window."""
    root = tmp_path / "ckpt"
    spare = BuddyServer(held_for(0, 1), TOKEN, own=0).start()
    try:
        host, port = spare.address
        notice = tmp_path / "notice.json"
        notice.write_text(json.dumps({"deadline": None, "handover": {"address": f"{host}:{port}", "token": TOKEN,
                                                                     "node": 0}}))

        def noticed(rank: int) -> None:
            state, (x, y) = gang_state(rank, ranks), tiny.dataset()
            ckpt = Checkpointer(state, config(str(root), every_steps=EVERY, notice_file=str(notice)))
            assert ckpt.backend.replicas is None  # no tier of its own: the hand-over is the notice's
            for step in range(STEPS):
                tiny.train_step(state, x, y)
                ckpt.save(step + 1)
            torch.save(progress_of(state.state_dict()), tmp_path / f"held-r{rank}-s{STEPS}.pt")
            assert ckpt.save(STEPS, kind="notice").committed

        assert run_gang(ranks, noticed) == [0] * ranks
        err = capfd.readouterr().err
        assert err.count(f"notice save of step {STEPS}: in the memory tier (the spare's store at {host}:{port})") == ranks
        assert sorted(rank for rank, step, *_ in status(spare.address, TOKEN)["replicas"] if step == STEPS) == \
            list(range(ranks))
        if storage_missed:
            shutil.rmtree(root / layout.step_dir(STEPS))
            assert newest_in_storage(tmp_path) < STEPS
        spare.hold_for(held_for(0, 1), own=0)  # the spare's trainer starts: its agent re-forms the store

        def resumed_on_the_spare(rank: int) -> None:
            state = gang_state(rank, ranks)
            ckpt = Checkpointer(state, config(str(root), memory_tier_addr=f"{host}:{port}", memory_tier_token=TOKEN))
            resumed = ckpt.load_latest()
            held = torch.load(tmp_path / f"held-r{rank}-s{STEPS}.pt", weights_only=False)
            (tmp_path / f"resumed-r{rank}.json").write_text(json.dumps({
                "step": resumed.step, "tier": resumed.tier, "in_storage": resumed.uri is not None,
                "difference": first_difference(progress_of(state.state_dict()), held)}))
            ckpt.close()

        assert run_gang(ranks, resumed_on_the_spare) == [0] * ranks
    finally:
        spare.close()
    got = [json.loads((tmp_path / f"resumed-r{rank}.json").read_text()) for rank in range(ranks)]
    assert got == [{"step": STEPS, "tier": "memory", "in_storage": not storage_missed, "difference": None}] * ranks
    assert f"step {STEPS} from the memory tier: valid (loss " in capfd.readouterr().err
