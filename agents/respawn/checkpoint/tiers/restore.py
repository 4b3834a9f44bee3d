"""Resuming from the memory tier: which step, from which nodes (`plan`), and a rank's
training state rebuilt from a replica a store served (verified by the store before it
left and by `client.fetch` on arrival): the same rebuild as a checkpoint's
(reader.rebuild), from the shard's bytes instead of storage's.

The fallback order: the newest step newer than storage's newest committed checkpoint,
or that checkpoint's own step (memory is the faster tier to read it from), at which
every rank of the gang as it is now finds the shard it resumes from (rank r: the old
gang's rank r's, as from a checkpoint) on a node that is left, its own node's or the
next node's; else storage. One node lost leaves each shard on one of its two nodes;
two neighbours lost together take a shard with them, and the gang resumes from storage.
A shard that fails its digests, or that a store no longer holds at that step, on any
rank sends every rank to storage: nothing unverified is loaded."""

from __future__ import annotations

import json

import torch

from .. import layout
from ..errors import CorruptCheckpointError
from ..reader import rebuild
from .shard import Shard


def state_of(shard: Shard) -> tuple[dict, dict]:
    """(the rank's state, its meta: step, world size, kind...) from a verified shard."""
    try:
        rank_state = json.loads(bytes(shard.files[layout.rank_state_file(shard.rank)]))
    except (KeyError, ValueError) as exc:
        raise CorruptCheckpointError(f"replica of rank {shard.rank}, step {shard.step}: no readable state file ({exc})") from None
    buffers = {}
    for index in sorted({slot["file"] for slot in rank_state["slots"]}):
        name = layout.data_file(shard.rank, index)
        if name not in shard.files:
            raise CorruptCheckpointError(f"replica of rank {shard.rank}, step {shard.step}: no {name}")
        data = shard.files[name]
        buffers[index] = torch.frombuffer(data, dtype=torch.uint8) if len(data) else torch.empty(0, dtype=torch.uint8)
    meta = {k: v for k, v in rank_state.items() if k not in ("skeleton", "slots")}
    return rebuild(rank_state, buffers), meta


def plan(holdings: list[list[list]], ranks: int, newer_than: int,
         ranks_per_node: int = 1) -> tuple[int, str, list[int]] | None:
    """`holdings[node]`: the [rank, step, bytes, gang] replicas that node's store holds (the
    gang as it is now, `ranks_per_node` ranks a node). The step to resume `ranks` ranks
    from, the run of the gang that sent its shards, and for each rank the node whose store
    holds its shard (its own node's first); None when no step newer than `newer_than` has
    every rank's shard from one run."""
    where: dict[tuple[int, int, str], int] = {}
    for node, held in enumerate(holdings):
        for rank, step, _, gang in held:
            if (rank, step, gang) not in where or node == rank // ranks_per_node:
                where[(rank, step, gang)] = node
    found = sorted({(step, gang) for _, step, gang in where if step > newer_than}, reverse=True)
    for step, gang in found:
        if all((rank, step, gang) in where for rank in range(ranks)):
            return step, gang, [where[(rank, step, gang)] for rank in range(ranks)]
    return None
