"""What the memory tier moves: one rank's files of one checkpoint step (a shard), and
which node keeps whose shard (the ring over the gang's nodes)."""

from __future__ import annotations

from dataclasses import dataclass

from .. import layout, manifest
from ..storage import Storage


@dataclass(frozen=True)
class Shard:
    """`files`: name -> bytes-like. `digests`: name -> xxh3-128 hex as the manifest records
    it; a file without one (a notice save not yet persisted) is digested as it is sent.
    `gang`: which run of the gang sent it (a trainer gang's start), so that shards of one
    step number from two runs (one resumed from an older checkpoint) are never mixed."""

    rank: int
    step: int
    files: dict
    digests: dict
    gang: str = ""

    @property
    def nbytes(self) -> int:
        return sum(len(data) for data in self.files.values())


Store = tuple[tuple[str, int], str]  # a node's store: its address and token


def buddy_of(node: int, nodes: int) -> int:
    """The node that keeps node `node`'s ranks' replicas: the next one round the gang's ring."""
    return (node + 1) % nodes


def held_for(node: int, nodes: int) -> int:
    """Whose ranks' replicas node `node` keeps: the previous node's, round the ring."""
    return (node - 1) % nodes


@dataclass(frozen=True)
class Ring:
    """The gang's nodes in ring order, each its store, and how many ranks each trains, laid
    out as torchrun lays them out (node n trains ranks n·P to n·P + P − 1, P a node). Rank
    r's shard lands on its own node's store and on the next node's: a node lost takes its
    ranks' trainers, never the only copy of their state."""

    stores: tuple[Store, ...]
    ranks_per_node: int = 1

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def own(self, rank: int) -> Store:
        return self.stores[self.node_of(rank)]

    def buddy(self, rank: int) -> Store:
        return self.stores[buddy_of(self.node_of(rank), len(self.stores))]


def _owned_by(name: str, rank: int) -> bool:
    return name.startswith(f"data-r{rank}-") or name == layout.rank_state_file(rank)


def shard_from_storage(storage: Storage, ckpt: str, rank: int) -> Shard:
    """Rank `rank`'s files of committed checkpoint `ckpt`, each verified against the
    manifest, with the manifest's digests (raises CorruptCheckpointError otherwise)."""
    found = manifest.read(storage, ckpt)
    entries = {name: entry for name, entry in found.files.items() if _owned_by(name, rank)}
    files = {name: manifest.read_verified(storage, ckpt, name, entry) for name, entry in entries.items()}
    return Shard(rank, found.step, files, {name: entry.digest for name, entry in entries.items()})
