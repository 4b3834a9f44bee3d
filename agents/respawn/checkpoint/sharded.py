"""Distributed state through `torch.distributed.checkpoint` (DCP) under our commit protocol.

For a gang whose model is wrapped in DDP (the same replica on every rank), sharded
with FSDP2 (`fully_shard`) or made of DTensors on any DeviceMesh. DCP's planner
decides who writes what: a replicated tensor is written by one rank only (DCP's
dedup gives each to the rank with the fewest bytes so far, so each rank writes
about 1/N of a DDP replica), a sharded one by the ranks that hold its shards. Its
file-system writer writes into our step directory with its own names
(`__<rank>_<n>.distcp`, `.metadata`), through our storage layer (`dcp_storage`): a
local folder, a shared mount or a bucket, each file durable when written and
digested on the way. Then:

1. each rank writes `rank-<r>.json` (its RNG states);
2. the entries are gathered on the coordinator's gloo group: a rank gets past that
   gather only once every rank's part is durable, and a dead rank fails it;
3. rank 0 writes state.json (step, framework, world size, scheduler, sampler,
   `extra`, and with validation the reference loss of the model's full weights,
   gathered from every rank before the write), then MANIFEST.json listing every rank's
   files, then LATEST; reports the checkpoint to the agent and rotates: the commit
   sequence `Checkpointer`'s does too (agents/respawn/checkpoint/commit.py, DESIGN §6, §11).

`ShardedCheckpointer` is the checkpoint manager (agents/respawn/checkpoint/manager.py: the
save policy, flags, stop) with the DCP writer (agents/respawn/checkpoint/dcp_writer.py) as
its backend; this module holds the DCP-specific rest: resume and the validator's read.

On load DCP reshards: a checkpoint written by N ranks loads on M ranks, for any mesh
(`ResumableSampler` keeps the global sample order when the global batch is the same).
Each rank resumes the RNG states of the rank of the same number, or of rank r mod N
when the writers were fewer.
The validator reads one in a single process (`load_checkpoint`): the model's full
weights, from every rank's files.

A periodic save is DCP's `async_save`: the step waits while the state is copied to host
memory (DCP's staging: one copy of this rank's part, held until it is written), then
trains on while DCP's thread writes it, on a gloo group of its own; it commits at a later
`save()` call, once the coordinator's table shows every rank's part written (or at the
next save, `close()`). A notice, final or asked-for save is written before `save()`
returns, straight from the live tensors. DCP's planning collectives run on the
coordinator's gloo group whatever the user's backend, so a job whose default group is
NCCL-only saves and loads the same way. Its
checkpoint URI must be one every rank and the validator reach: a bucket, or for a local
path one node or a shared mount.
"""

from __future__ import annotations

import base64
import json
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import set_state_dict

from respawn import protocol, trainer

from . import layout, manifest
from .config import CheckpointConfig, SaveOutcome
from .dcp_storage import StorageReader
from .dcp_writer import FRAMEWORK, WRITER, DcpWriter, failure_reason, rank_file
from .distributed import Coordinator
from .errors import CheckpointError, CorruptCheckpointError, IncompatibleCheckpointError
from .manager import CheckpointManager
from .reader import CheckpointRef, LoadedCheckpoint, committed, other_framework, read_json
from .resume import Resumed, Skipped
from .rotation import remove_torn
from .state import set_rng_state
from .storage import open_storage


def load_checkpoint(ref: CheckpointRef) -> LoadedCheckpoint:
    """A committed DCP checkpoint read in this one process, without a process group, for
    the validator: every file checked against its manifest, then the model's full
    (unsharded) weights as "model". Another framework's raises IncompatibleCheckpointError."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    man = manifest.verify_all(ref.storage, ref.name)
    meta = read_json(ref, man, layout.STATE)
    if meta.get("writer") != WRITER:
        raise other_framework(ref.uri, meta.get("framework", "?"), FRAMEWORK)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is unavailable or uninitialized")  # single process is meant
        try:
            state = _load_state_dict_from_keys("model", storage_reader=StorageReader(ref.storage, ref.name))
        except (Exception, dcp.CheckpointException) as exc:
            # Its bytes are the ones written (the digests passed): the check failed, nothing is condemned.
            raise IncompatibleCheckpointError(f"checkpoint {ref.uri}: DCP cannot read its model here: "
                                              f"{failure_reason(exc, 0)}") from None
    return LoadedCheckpoint(ref, meta, state, man)


def model_signature(model: torch.nn.Module) -> dict[str, str]:
    """Each state entry's global shape and dtype, the same on every rank of one model
    whatever its sharding (a DTensor's `shape` is the global one)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return {name: f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"
            for name, t in get_model_state_dict(model).items() if isinstance(t, torch.Tensor)}


def _differences(mine: dict[str, str], zeros: dict[str, str]) -> list[str]:
    out = [f"{name} is {mine[name]} there, {zeros[name]} on rank 0" for name in sorted(mine.keys() & zeros.keys())
           if mine[name] != zeros[name]]
    out += [f"{name} only there" for name in sorted(mine.keys() - zeros.keys())]
    out += [f"{name} only on rank 0" for name in sorted(zeros.keys() - mine.keys())]
    return out


def _decode_rng(body: dict) -> dict:
    def tensor(text: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)

    version, internal, gauss = body["python"]
    kind, keys, pos, has_gauss, cached = body["numpy"]
    state = {"python": (version, tuple(internal), gauss),
             "numpy": (kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached),
             "torch": tensor(body["torch"])}
    if "cuda" in body:
        state["cuda"] = [tensor(s) for s in body["cuda"]]
    return state


@dataclass
class ShardedState:
    """The loop's objects: `model` (DDP, FSDP2 or DTensor-holding module), its optimizer,
    and the rest (any may be None). `extra` must be the same on every rank (rank 0's is
    saved)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None = None
    scheduler: Any = None
    sampler: Any = None
    extra: dict | None = None


class ShardedCheckpointer(CheckpointManager):
    """`load_latest()` once, `save(step)` after every step, `close()` at the end; every
    rank calls each together. Saves every `config.every_steps` steps (or every
    `interval_s` as rank 0's clock says), at a stop (SIGTERM on any rank,
    `request_stop()`) or when `save(step, kind=...)` asks."""

    def __init__(self, state: ShardedState, config: CheckpointConfig):
        super().__init__(config, Coordinator(config.agree_every_steps))
        self.state = state
        self.storage = open_storage(config.uri)
        self.rank, self.world_size = self.coord.rank, self.coord.world_size
        self._check_same_model()
        self._start(DcpWriter(state, config, self.storage, self.coord, self.clock))

    def _check_same_model(self) -> None:
        """Every rank must train the same model: a rank started with another one would
        write or load shards of another shape. Named here, before anything is saved."""
        signatures = self.coord.gather_objects(model_signature(self.state.model))
        wrong = {r: _differences(s, signatures[0]) for r, s in enumerate(signatures) if s != signatures[0]}
        if wrong:
            detail = "; ".join(f"rank {r}: {', '.join(d[:3])}" for r, d in wrong.items())
            raise IncompatibleCheckpointError(f"the ranks of this gang hold different models ({detail}): every rank "
                                              f"must build the same model; nothing was saved or deleted")

    # --- resuming --------------------------------------------------------------------------
    def _choose(self) -> tuple[str | None, tuple[Skipped, ...]]:
        """Rank 0: the newest committed checkpoint whose every file passes its digest."""
        remove_torn(self.storage)
        skipped = []
        for ref in reversed(committed(self.storage)):
            if (ref.validation() or {}).get("result") == "invalid":
                skipped.append(Skipped(ref.step, ref.uri, "marked invalid"))
                continue
            try:
                manifest.verify_all(self.storage, ref.name)
            except CorruptCheckpointError as exc:
                skipped.append(Skipped(ref.step, ref.uri, str(exc)))
                continue
            meta = json.loads(self.storage.read(ref.key(layout.STATE)))
            if meta.get("writer") != WRITER:
                raise other_framework(ref.uri, meta.get("framework", "?"), FRAMEWORK)
            return ref.name, tuple(skipped)
        return None, tuple(skipped)

    def load_latest(self) -> Resumed:
        """Restore the newest intact checkpoint on this world size, resharding it when
        it was written by another; `.step` is where the loop continues (0: none)."""
        choice = self._choose() if self.rank == 0 else None
        name, skipped = self.coord.broadcast_from_zero(choice)
        if name is None:
            return Resumed(0, None, skipped)
        ref = CheckpointRef(self.storage, name)
        meta = json.loads(self.storage.read(ref.key(layout.STATE)))
        if self.state.sampler is not None and meta["sampler"] is not None:
            try:
                self.state.sampler.load_state_dict(meta["sampler"])
            except ValueError as exc:
                raise IncompatibleCheckpointError(f"checkpoint {ref.uri} (written by {meta['world_size']} ranks) "
                                                  f"cannot resume on {self.world_size} ranks: {exc}; nothing was deleted") from None
        target = self.backend.train_state()
        try:
            dcp.load(target, storage_reader=StorageReader(self.storage, name), process_group=self.coord.group)
        except (Exception, dcp.CheckpointException) as exc:
            raise IncompatibleCheckpointError(f"checkpoint {ref.uri} does not fit rank {self.rank}'s model: "
                                              f"{failure_reason(exc, self.rank)}; nothing was deleted") from None
        set_state_dict(self.state.model, self.state.optimizer or [], model_state_dict=target["model"],
                       optim_state_dict=target.get("optim", {}))
        if self.state.scheduler is not None and meta["scheduler"] is not None:
            self.state.scheduler.load_state_dict(meta["scheduler"])
        if self.state.extra is not None:
            self.state.extra.clear()
            self.state.extra.update(meta["extra"])
        source = self.rank if self.rank < meta["world_size"] else self.rank % meta["world_size"]
        set_rng_state(_decode_rng(json.loads(self.storage.read(ref.key(rank_file(source))))["rng"]))
        self.resumed_at(ref.step)
        return Resumed(ref.step, ref.uri, skipped)

    def finish(self, step: int) -> SaveOutcome:
        outcome = self.save(step, kind=protocol.CheckpointKind.FINAL)
        if not outcome.committed:
            raise CheckpointError(f"final checkpoint of step {step} was not committed: {outcome.message}")
        trainer.report(step, force=True)
        return outcome
