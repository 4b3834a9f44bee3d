"""The memory tier's buddy store (agents/respawn/checkpoint/tiers/): real buddy processes
on loopback, real sockets cut and real SIGKILLs; nothing torn or unverified is served."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time

import pytest

from respawn.checkpoint import Checkpointer, layout
from respawn.checkpoint.storage import open_storage
from respawn.checkpoint.tiers import (BuddyServer, ReplicaUnavailable, Shard, buddy_of, fetch, held_for, replicate, settle,
                                      shard_from_storage, status, wire)

from .conftest import TOKEN, config, train

MIB = 1 << 20


def random_shard(rank: int, step: int, size: int = MIB) -> Shard:
    return Shard(rank, step, {layout.data_file(rank, 0): os.urandom(size), layout.rank_state_file(rank): b'{"step": %d}' % step}, {})


def same_bytes(a: Shard, b: Shard) -> bool:
    return a.step == b.step and a.files.keys() == b.files.keys() and all(bytes(a.files[n]) == bytes(b.files[n]) for n in a.files)


def test_a_committed_step_replicated_to_a_buddy_process_comes_back_bitwise_equal(root, state, data, buddies):
    ckpt = Checkpointer(state, config(root, every_steps=5))
    train(state, data, ckpt, 0, 5)
    assert ckpt.wait().committed
    ckpt.close()
    storage = open_storage(root)
    shard = shard_from_storage(storage, layout.step_dir(5), rank=0)
    assert layout.STATE in shard.files and any(name.startswith("data-r0-") for name in shard.files)

    buddy = buddies(held_for(buddy_of(0, 2), 2))  # the node after rank 0's keeps rank 0's
    replicate(buddy.address, TOKEN, shard)
    back = fetch(buddy.address, TOKEN, rank=0)

    assert same_bytes(back, shard)
    assert back.digests == shard.digests  # the manifest's own digests, kept and served
    for name, data_ in back.files.items():
        assert bytes(data_) == storage.read(f"{layout.step_dir(5)}/{name}")


def test_a_byte_corrupted_in_the_buddys_memory_is_never_served():
    server = BuddyServer(holds_for=0, token=TOKEN).start()
    try:
        replicate(server.address, TOKEN, random_shard(0, 5))
        name = layout.data_file(0, 0)
        server.replicas[0][-1].files[name][12345] ^= 0x01  # bit rot in the buddy's host memory

        with pytest.raises(ReplicaUnavailable, match=f"{name} no longer match their digest"):
            fetch(server.address, TOKEN, rank=0)
    finally:
        server.close()


def test_a_put_that_fails_its_digest_on_receipt_is_refused_and_the_previous_replica_stays(buddies):
    buddy = buddies(0)
    good = random_shard(0, 5)
    replicate(buddy.address, TOKEN, good)
    bad = random_shard(0, 10)
    wrong = {name: "0" * 32 for name in bad.files}

    with pytest.raises(ReplicaUnavailable, match="failed the xxh3_128 digest on receipt"):
        replicate(buddy.address, TOKEN, Shard(0, 10, bad.files, wrong))
    assert same_bytes(fetch(buddy.address, TOKEN, rank=0), good)


def test_a_buddy_refuses_another_ranks_shard_and_an_older_step(buddies):
    buddy = buddies(1)
    replicate(buddy.address, TOKEN, random_shard(1, 10))
    with pytest.raises(ReplicaUnavailable, match=r"keeps the replicas of node 1's ranks, not of node 2's \(rank 2\)"):
        replicate(buddy.address, TOKEN, random_shard(2, 20))
    with pytest.raises(ReplicaUnavailable, match="step 5 is not newer than the replica's step 10"):
        replicate(buddy.address, TOKEN, random_shard(1, 5))
    fresh = BuddyServer(holds_for=1, token=TOKEN).start()
    try:
        with pytest.raises(ReplicaUnavailable, match="no replica of rank 1 has arrived"):
            fetch(fresh.address, TOKEN, rank=1)
    finally:
        fresh.close()


HALF_A_PUT = """
import socket, sys, time
from respawn.checkpoint.tiers import wire
sock = socket.create_connection(("{host}", {port}))
wire.send_frame(sock, {{"op": "put", "token": "{token}", "rank": 0, "step": 10, "files": [["data-r0-0.bin", {size}]]}})
assert wire.recv_frame(sock)["ok"]
sock.sendall(b"x" * ({size} // 2))
print("half sent", flush=True)
time.sleep(60)
"""


def test_a_connection_cut_mid_transfer_leaves_the_previous_replica_served_and_the_torn_one_never(buddies):
    buddy = buddies(0)
    good = random_shard(0, 5)
    replicate(buddy.address, TOKEN, good)
    size = 4 * MIB
    sender = subprocess.Popen([sys.executable, "-c", HALF_A_PUT.format(token=TOKEN, host=buddy.address[0], port=buddy.address[1], size=size)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert sender.stdout.readline().strip() == "half sent"
        assert same_bytes(fetch(buddy.address, TOKEN, rank=0), good)  # while the put is half there
        assert status(buddy.address, TOKEN)["receiving"] == size
    finally:
        os.kill(sender.pid, signal.SIGKILL)  # the sender's node dies mid-transfer
        sender.wait()

    deadline = time.monotonic() + 30
    while status(buddy.address, TOKEN)["receiving"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status(buddy.address, TOKEN) == {"keeps": [0], "replicas": [[0, 5, good.nbytes, ""]], "receiving": 0}
    assert same_bytes(fetch(buddy.address, TOKEN, rank=0), good)


def test_a_sender_that_falls_silent_mid_put_is_dropped_and_the_next_put_is_taken():
    """A node lost without a FIN: no reset ever comes, so the buddy's idle timeout ends the put."""
    server = BuddyServer(holds_for=0, token=TOKEN, idle_timeout_s=0.5).start()
    silent = socket.create_connection(server.address)
    try:
        replicate(server.address, TOKEN, random_shard(0, 5))
        wire.send_frame(silent, {"op": "put", "token": TOKEN, "rank": 0, "step": 10, "files": [["data-r0-0.bin", MIB]]})
        assert wire.recv_frame(silent)["ok"]
        silent.sendall(b"x" * (MIB // 2))  # and nothing more, and no close

        newer = random_shard(0, 11)
        replicate(server.address, TOKEN, newer, silent_s=10)  # waits for the slot the silent put held
        assert same_bytes(fetch(server.address, TOKEN, rank=0), newer)
    finally:
        silent.close()
        server.close()


def test_a_ring_of_three_nodes_one_sigkilled_loses_only_the_replica_it_held(buddies):
    world = 3
    nodes = [buddies(held_for(rank, world)) for rank in range(world)]
    shards = [random_shard(rank, 40) for rank in range(world)]
    for rank, shard in enumerate(shards):
        replicate(nodes[buddy_of(rank, world)].address, TOKEN, shard)

    nodes[1].kill()  # rank 0's buddy

    with pytest.raises(ReplicaUnavailable, match="unreachable"):
        fetch(nodes[buddy_of(0, world)].address, TOKEN, rank=0)  # rank 0 falls back to storage: the caller's call
    # Node 1's own state survives on node 2: a replacement for node 1 restores it from there.
    assert same_bytes(fetch(nodes[buddy_of(1, world)].address, TOKEN, rank=1), shards[1])
    assert same_bytes(fetch(nodes[buddy_of(2, world)].address, TOKEN, rank=2), shards[2])


def test_a_buddy_holds_one_shard_at_rest_once_the_gang_settles_each_step(buddies):
    buddy = buddies(0)
    size = 32 * MIB
    before = buddy.rss_bytes()
    for step in (1, 2, 3, 4):
        replicate(buddy.address, TOKEN, random_shard(0, step, size))
        settle(buddy.address, TOKEN, 0, step)  # every rank's replica of it landed
    held = status(buddy.address, TOKEN)
    assert held["replicas"] == [[0, 4, size + len(b'{"step": 4}'), ""]]
    # The older replicas and the receive buffers are freed; allocator slack is a few MiB.
    assert buddy.rss_bytes() - before <= size + 8 * MIB


def test_a_request_without_the_stores_token_is_refused_and_the_replica_is_untouched(buddies):
    buddy = buddies(0)
    good = random_shard(0, 5)
    replicate(buddy.address, TOKEN, good)

    for wrong in ("", "not-" + TOKEN):
        with pytest.raises(ReplicaUnavailable, match="token is not this store's"):
            replicate(buddy.address, wrong, random_shard(0, 10))
        with pytest.raises(ReplicaUnavailable, match="token is not this store's"):
            fetch(buddy.address, wrong, rank=0)
        with pytest.raises(ReplicaUnavailable, match="token is not this store's"):
            status(buddy.address, wrong)
    assert same_bytes(fetch(buddy.address, TOKEN, rank=0), good)


def test_a_store_keeps_every_rank_of_the_nodes_it_holds_for_and_no_other_nodes(buddies):
    """torchrun's layout, two ranks a node: node 1 of a ring of 3 keeps node 0's ranks
    (0, 1) and its own (2, 3), each put naming its sender's node."""
    store = buddies(0, own=1)
    shards = {rank: random_shard(rank, 10) for rank in range(4)}
    for rank, shard in shards.items():
        replicate(store.address, TOKEN, shard, node=rank // 2)
    with pytest.raises(ReplicaUnavailable, match=r"replicas of node 0's and node 1's ranks, not of node 2's \(rank 4\)"):
        replicate(store.address, TOKEN, random_shard(4, 10), node=2)
    assert sorted(rank for rank, *_ in status(store.address, TOKEN)["replicas"]) == [0, 1, 2, 3]
    assert all(same_bytes(fetch(store.address, TOKEN, rank=rank), shard) for rank, shard in shards.items())


def test_a_store_told_to_hold_another_rank_serves_the_old_replica_until_the_new_forms_first_put():
    """A regrouped gang's node keeps another rank's replica from then on; the one it held
    is still what a regroup restores the lost rank from."""
    server = BuddyServer(holds_for=2, token=TOKEN).start()
    try:
        old = random_shard(2, 40)
        replicate(server.address, TOKEN, old)
        server.hold_for(1)
        assert same_bytes(fetch(server.address, TOKEN, rank=2), old)
        with pytest.raises(ReplicaUnavailable, match=r"keeps the replicas of node 1's ranks, not of node 2's \(rank 2\)"):
            replicate(server.address, TOKEN, random_shard(2, 50))

        new = random_shard(1, 30)  # an older step than the old replica's: the gang resumed from storage
        replicate(server.address, TOKEN, new)
        assert same_bytes(fetch(server.address, TOKEN, rank=1), new)
        with pytest.raises(ReplicaUnavailable, match="no replica of rank 2"):
            fetch(server.address, TOKEN, rank=2)
        with pytest.raises(ReplicaUnavailable, match="step 30 is not newer than the replica's step 30"):
            replicate(server.address, TOKEN, random_shard(1, 30))  # within one form, only newer steps
    finally:
        server.close()


def test_a_trainer_with_more_than_a_thousand_files_open_replicates_as_any_other():
    """A real trainer's process holds many descriptors (DataLoader workers pass tensors by
    file descriptor; datasets, shards, logs): a replication's socket numbered past 1,023,
    which select() cannot watch, must connect and land like any other."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    server = BuddyServer(holds_for=0, token=TOKEN).start()
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        shard = random_shard(0, 5)
        replicate(server.address, TOKEN, shard)
        assert same_bytes(fetch(server.address, TOKEN, rank=0), shard)
    finally:
        for fd in held:
            os.close(fd)
        server.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_restarted_trainer_of_the_same_rank_replicates_again_from_its_resume_step():
    server = BuddyServer(holds_for=0, token=TOKEN).start()
    try:
        replicate(server.address, TOKEN, random_shard(0, 50))
        server.hold_for(0)  # the agent restarts the trainer: it resumes from step 40 in storage
        again = random_shard(0, 41)
        replicate(server.address, TOKEN, again)
        assert same_bytes(fetch(server.address, TOKEN, rank=0), again)
    finally:
        server.close()


def test_a_store_keeps_the_previous_step_until_the_gang_says_the_newest_is_whole():
    """A node lost while its replication lands leaves the step before whole elsewhere."""
    server = BuddyServer(holds_for=0, token=TOKEN).start()
    try:
        older, newer = random_shard(0, 5), random_shard(0, 10)
        replicate(server.address, TOKEN, older)
        replicate(server.address, TOKEN, newer)
        assert [row[:2] for row in status(server.address, TOKEN)["replicas"]] == [[0, 5], [0, 10]]
        assert same_bytes(fetch(server.address, TOKEN, rank=0, step=5), older)
        assert same_bytes(fetch(server.address, TOKEN, rank=0), newer)

        settle(server.address, TOKEN, 0, 10)
        assert [row[:2] for row in status(server.address, TOKEN)["replicas"]] == [[0, 10]]
        with pytest.raises(ReplicaUnavailable, match="no replica of rank 0 of step 5"):
            fetch(server.address, TOKEN, rank=0, step=5)
        replicate(server.address, TOKEN, random_shard(0, 15))
        replicate(server.address, TOKEN, random_shard(0, 20))  # unsettled: at most two are kept
        assert [row[:2] for row in status(server.address, TOKEN)["replicas"]] == [[0, 15], [0, 20]]
    finally:
        server.close()
