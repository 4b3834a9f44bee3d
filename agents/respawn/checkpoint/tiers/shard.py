"""What the memory tier moves: one rank's files of one checkpoint step (a shard), and
which node keeps whose shard (the ring)."""

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


def buddy_of(rank: int, world: int) -> int:
    """The rank whose node keeps `rank`'s replica: the next one round the gang's ring."""
    return (rank + 1) % world


def held_for(rank: int, world: int) -> int:
    """Whose replica `rank`'s node keeps: the previous one round the ring."""
    return (rank - 1) % world


def _owned_by(name: str, rank: int) -> bool:
    return name.startswith(f"data-r{rank}-") or name == layout.rank_state_file(rank)


def shard_from_storage(storage: Storage, ckpt: str, rank: int) -> Shard:
    """Rank `rank`'s files of committed checkpoint `ckpt`, each verified against the
    manifest, with the manifest's digests (raises CorruptCheckpointError otherwise)."""
    found = manifest.read(storage, ckpt)
    entries = {name: entry for name, entry in found.files.items() if _owned_by(name, rank)}
    files = {name: manifest.read_verified(storage, ckpt, name, entry) for name, entry in entries.items()}
    return Shard(rank, found.step, files, {name: entry.digest for name, entry in entries.items()})
