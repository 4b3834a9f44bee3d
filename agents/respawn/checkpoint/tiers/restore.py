"""A rank's training state rebuilt from a replica its buddy served (verified by the buddy
before it left and by `client.fetch` on arrival): the same rebuild as a checkpoint's
(reader.rebuild), from the shard's bytes instead of storage's."""

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
