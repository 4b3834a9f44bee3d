"""Reading committed checkpoints: find them, verify them, rebuild their state."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from . import codec, layout, manifest
from .errors import CorruptCheckpointError, IncompatibleCheckpointError
from .snapshot import Slot, view_of
from .storage import Storage, open_storage


FRAMEWORK_NAMES = {"torch": "a PyTorch loop with Checkpointer (torch)", "hf": "the Hugging Face Trainer integration (hf)",
                   "lightning": "the Lightning integration (lightning)", "accelerate": "the Accelerate integration (accelerate)",
                   "jax": "the JAX integration (jax)"}


def other_framework(uri: str, written_by: str, wanted: str) -> IncompatibleCheckpointError:
    """The error for a checkpoint another framework wrote (DESIGN §11): falling back past it
    would silently train from older state, and deleting it would lose the other run's work."""
    return IncompatibleCheckpointError(
        f"checkpoint {uri} was written by {FRAMEWORK_NAMES.get(written_by, written_by)}, this run resumes "
        f"{FRAMEWORK_NAMES.get(wanted, wanted)} checkpoints: point the job at another checkpoint root "
        f"(nothing was deleted)")


@dataclass(frozen=True)
class CheckpointRef:
    """One checkpoint directory in a storage root."""

    storage: Storage
    name: str  # e.g. "step-00001200"

    @property
    def step(self) -> int:
        return layout.parse_step_dir(self.name)

    @property
    def uri(self) -> str:
        return self.storage.url_for(self.name)

    def key(self, filename: str) -> str:
        return f"{self.name}/{filename}"

    def is_committed(self) -> bool:
        return self.storage.exists(self.key(layout.MANIFEST))

    def validation(self) -> dict | None:
        """The recorded validation verdict, or None while pending."""
        key = self.key(layout.VALIDATION)
        return json.loads(self.storage.read(key)) if self.storage.exists(key) else None


def ref_from_uri(uri: str) -> CheckpointRef:
    """`<root>/step-00001200` -> a CheckpointRef in the storage opened at `<root>`."""
    parts = layout.split_uri(uri)
    if parts is None:
        raise CorruptCheckpointError(f"{uri!r} does not name a checkpoint directory (expected <root>/step-NNNNNNNN)")
    root, name = parts
    return CheckpointRef(open_storage(root), name)


def list_checkpoints(storage: Storage) -> list[CheckpointRef]:
    """Every step directory under the root (committed or not), oldest first, including
    one that holds nothing but unfinished writes (a save killed before any file closed)."""
    names = {key.split("/", 1)[0] for key in [*storage.list(""), *storage.unfinished("")]}
    refs = [CheckpointRef(storage, n) for n in names if layout.parse_step_dir(n) is not None]
    return sorted(refs, key=lambda r: r.step)


def committed(storage: Storage) -> list[CheckpointRef]:
    return [r for r in list_checkpoints(storage) if r.is_committed()]


@dataclass
class LoadedCheckpoint:
    ref: CheckpointRef
    meta: dict  # state.json without the rank's payload
    state: dict  # the rank's TrainState.state_dict()-shaped state
    manifest: manifest.Manifest


def load(ref: CheckpointRef, rank: int = 0) -> LoadedCheckpoint:
    """Verify the manifest and every file this rank needs, then rebuild its state."""
    man = manifest.read(ref.storage, ref.name)
    meta = read_json(ref, man, layout.STATE)
    if "slots" not in meta:  # a framework's own files (agents/respawn/integrations/accelerate.py), not Respawn's tensors
        raise other_framework(ref.uri, meta.get("framework", "?"), "torch, hf or lightning")
    if rank >= meta.get("world_size", 1):
        raise CorruptCheckpointError(f"checkpoint {ref.uri} was saved by {meta.get('world_size', 1)} ranks, rank {rank} has no state in it")
    rank_state = meta if rank == 0 else read_json(ref, man, layout.rank_state_file(rank))
    names = {index: layout.data_file(rank, index) for index in sorted({slot["file"] for slot in rank_state["slots"]})}
    for name in names.values():
        if name not in man.files:
            raise CorruptCheckpointError(f"checkpoint {ref.uri}: its manifest does not list data file {name}")

    def read(name: str) -> torch.Tensor:
        data = manifest.read_verified(ref.storage, ref.name, name, man.files[name])
        return torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)

    # The files were written in parallel; read (and verify) them in parallel too.
    with ThreadPoolExecutor(max_workers=max(1, len(names)), thread_name_prefix="ckpt-read") as pool:
        buffers = dict(zip(names, pool.map(read, names.values())))
    state = rebuild(rank_state, buffers)
    meta = {k: v for k, v in meta.items() if k not in ("skeleton", "slots")}
    return LoadedCheckpoint(ref, meta, state, man)


def rebuild(rank_state: dict, buffers: dict[int, torch.Tensor]) -> dict:
    """A rank's state from its state file's skeleton and slots and its data files' bytes
    (flat uint8 tensors by file index), as views into them."""
    tensors = [view_of(buffers.get(s.file), s) for s in map(Slot.from_json, rank_state["slots"])]
    return codec.unflatten(rank_state["skeleton"], tensors)


def read_json(ref: CheckpointRef, man: manifest.Manifest, name: str) -> Any:
    if name not in man.files:
        raise CorruptCheckpointError(f"checkpoint {ref.uri}: its manifest does not list {name}")
    raw = manifest.read_verified(ref.storage, ref.name, name, man.files[name])
    return json.loads(bytes(raw))
