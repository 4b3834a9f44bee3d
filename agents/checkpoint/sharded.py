"""Distributed state through `torch.distributed.checkpoint` (DCP) under our commit protocol.

For a gang whose model is wrapped in DDP (the same replica on every rank), sharded
with FSDP2 (`fully_shard`) or made of DTensors on any DeviceMesh. DCP's planner
decides who writes what: a replicated tensor is written by one rank only (DCP's
dedup gives each to the rank with the fewest bytes so far, so each rank writes
about 1/N of a DDP replica), a sharded one by the ranks that hold its shards. Its
`FileSystemWriter` writes into our step directory with its own names
(`__<rank>_<n>.distcp`, `.metadata`) and fsyncs each file. Then:

1. each rank digests its own files and writes `rank-<r>.json` (its RNG states);
2. the entries are gathered on the coordinator's gloo group: a rank gets past that
   gather only once every rank's part is durable, and a dead rank fails it;
3. rank 0 writes state.json (step, framework, world size, scheduler, sampler,
   `extra`), then MANIFEST.json listing every rank's files, then LATEST; reports the
   checkpoint to the agent and rotates, as `Checkpointer` does (DESIGN §6, §11).

On load DCP reshards: a checkpoint written by N ranks loads on M ranks, for any mesh
(`ResumableSampler` keeps the global sample order when the global batch is the same).
Each rank resumes the RNG states of the rank of the same number, or of rank r mod N
when the writers were fewer.

The save is synchronous (the step waits for it: DCP's own writer has no pacing or
cancel point); the data goes straight from the live tensors, so no host copy of the
state is held. It needs a file system every rank and the reader see (one node, or a
shared mount): DCP's writer writes paths, not our object-store keys.
"""

from __future__ import annotations

import base64
import json
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from agents import protocol, trainer

from . import channel, layout, manifest
from .checkpointer import DEFAULT_INTERVAL_S, CheckpointConfig, SaveOutcome
from .distributed import Coordinator
from .errors import CheckpointError, ConfigError, CorruptCheckpointError, IncompatibleCheckpointError
from .reader import CheckpointRef, committed, other_framework
from .resume import Resumed, Skipped
from .rotation import remove_torn, rotate
from .state import rng_state, set_rng_state
from .storage import open_storage
from .storage.local import LocalStorage

FRAMEWORK = "torch-dcp"
WRITER = "torch.distributed.checkpoint"
_STOP, _NOW, _DUE = range(3)


def rank_file(rank: int) -> str:
    return f"rank-{rank}.json"


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


def _reason(exc: BaseException, rank: int) -> str:
    """What went wrong, in one line: DCP wraps each rank's error (with its traceback) in a
    CheckpointException (a BaseException) whose own text is only the list of ranks."""
    if isinstance(exc, dcp.CheckpointException) and exc.failures:
        exc = exc.failures.get(rank, next(iter(exc.failures.values())))[0]
    return f"{type(exc).__name__}: {exc}"


def _encode_rng(state: dict) -> dict:
    """RNG states as JSON: the torch ones as base64 bytes, numpy's array as a list."""
    kind, keys, pos, has_gauss, cached = state["numpy"]
    out = {"python": [state["python"][0], list(state["python"][1]), state["python"][2]],
           "numpy": [kind, keys.tolist(), pos, has_gauss, cached],
           "torch": base64.b64encode(state["torch"].numpy().tobytes()).decode()}
    if "cuda" in state:
        out["cuda"] = [base64.b64encode(s.numpy().tobytes()).decode() for s in state["cuda"]]
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


class ShardedCheckpointer:
    """`load_latest()` once, `save(step)` after every step, `close()` at the end; every
    rank calls each together. Saves every `config.every_steps` steps (or every
    `interval_s` as rank 0's clock says), at a stop (SIGTERM on any rank,
    `request_stop()`) or when `save(step, kind=...)` asks."""

    def __init__(self, state: ShardedState, config: CheckpointConfig):
        self.state = state
        self.config = config
        self.storage = open_storage(config.uri)
        if not isinstance(self.storage, LocalStorage):
            raise ConfigError(f"checkpoint URI {config.uri}: sharded (DCP) checkpoints are written to a file system "
                              f"every rank sees, not an object store")
        self.coord = Coordinator(config.agree_every_steps)
        self.rank, self.world_size = self.coord.rank, self.coord.world_size
        self._check_same_model()
        self._last_save_at = time.monotonic()
        self._last_saved_step = -1
        self._stop_seen = self._now_seen = False
        self.should_stop = False
        self.last_outcome: SaveOutcome | None = None
        self._previous_handlers: dict = {}
        if config.handle_signals and threading.current_thread() is threading.main_thread():
            for sig, handler in ((signal.SIGTERM, self._on_stop), (signal.SIGUSR1, self._on_checkpoint_now)):
                self._previous_handlers[sig] = signal.signal(sig, handler)

    def _gather_objects(self, obj) -> list:
        if self.world_size == 1:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.coord.group)
        return out

    def _check_same_model(self) -> None:
        """Every rank must train the same model: a rank started with another one would
        write or load shards of another shape. Named here, before anything is saved."""
        signatures = self._gather_objects(model_signature(self.state.model))
        wrong = {r: _differences(s, signatures[0]) for r, s in enumerate(signatures) if s != signatures[0]}
        if wrong:
            detail = "; ".join(f"rank {r}: {', '.join(d[:3])}" for r, d in wrong.items())
            raise IncompatibleCheckpointError(f"the ranks of this gang hold different models ({detail}): every rank "
                                              f"must build the same model; nothing was saved or deleted")

    # --- flags (a signal only sets one: the save happens at the next save() call) -----------
    def _on_stop(self, signum, frame) -> None:
        self._stop_seen = True

    def _on_checkpoint_now(self, signum, frame) -> None:
        self._now_seen = True

    def request_stop(self) -> None:
        self._stop_seen = True

    def request_checkpoint(self) -> None:
        self._now_seen = True

    def _due(self, step: int) -> bool:
        """By steps, the same on every rank at the same call; by time, rank 0's clock decides
        (through the agreed table, a call or more later)."""
        if self.config.every_steps:
            return step - max(self._last_saved_step, 0) >= self.config.every_steps
        return time.monotonic() - self._last_save_at >= (self.config.interval_s or DEFAULT_INTERVAL_S)

    # --- saving ----------------------------------------------------------------------------
    def save(self, step: int, kind: str | None = None) -> SaveOutcome | None:
        if kind not in (None, *protocol.CheckpointKind.ALL):
            raise ValueError(f"save kind {kind!r} is not one of {protocol.CheckpointKind.ALL}")
        table = self.coord.agreed([int(self._stop_seen), int(self._now_seen), int(self._due(step))])
        outcome = None
        stop = table is not None and any(row[_STOP] for row in table)
        if stop:
            self.should_stop = True
            kind = protocol.CheckpointKind.NOTICE
        elif kind is None and (self.config.every_steps and self._due(step) or table is not None
                               and (any(row[_NOW] for row in table) or table[0][_DUE])):
            kind = protocol.CheckpointKind.PERIODIC
        if kind is not None and step != self._last_saved_step:
            self._stop_seen = self._now_seen = False
            outcome = self._save(step, kind)
        self.coord.share([int(self._stop_seen), int(self._now_seen), int(self._due(step))])
        return outcome

    def _save(self, step: int, kind: str) -> SaveOutcome:
        started = time.monotonic()
        ckpt = layout.step_dir(step)
        outcome = SaveOutcome(step, kind, False, self.storage.url_for(ckpt))
        self._last_saved_step, self._last_save_at = step, time.monotonic()
        if self.coord.broadcast_from_zero(CheckpointRef(self.storage, ckpt).is_committed()):
            outcome.committed, outcome.message = True, "already committed"
            return outcome
        if self.rank == 0:
            self.storage.delete_prefix(ckpt)  # an abandoned attempt's files (perhaps of another world size)
        error = None
        try:
            self._gather_objects(None)  # the directory is clean before anyone writes into it
            entries = self._write(step, ckpt)
        except (Exception, dcp.CheckpointException) as exc:
            error, entries = exc, None
        parts = self._gather_objects(entries if error is None else _reason(error, self.rank))
        failed = {r: p for r, p in enumerate(parts) if not isinstance(p, dict)}
        if failed:
            outcome.message = "; ".join(f"rank {r} did not write its part: {p}" for r, p in failed.items())
        elif self.rank == 0:
            try:
                self._commit(step, kind, ckpt, {n: e for p in parts for n, e in p.items()}, outcome, started)
            except Exception as exc:
                outcome.message = f"commit of step {step} failed: {type(exc).__name__}: {exc}"
        outcome.committed, outcome.checkpoint_id = self.coord.broadcast_from_zero((outcome.committed, outcome.checkpoint_id))
        outcome.save_s = time.monotonic() - started
        if not outcome.committed:
            previous = [r.name for r in committed(self.storage)]
            outcome.message = (outcome.message or "rank 0 did not commit") + \
                f"; previous checkpoint {previous[-1] if previous else '(none)'} is intact"
        print(f"respawn checkpoint: {kind} save of step {step}: "
              f"{'committed ' + outcome.uri if outcome.committed else outcome.message}", file=sys.stderr, flush=True)
        self.last_outcome = outcome
        return outcome

    def _train_state(self) -> dict:
        model, optim = get_state_dict(self.state.model, self.state.optimizer or [])
        return {"model": model, "optim": optim} if self.state.optimizer is not None else {"model": model}

    def _write(self, step: int, ckpt: str) -> dict[str, manifest.FileEntry]:
        """DCP writes this rank's part (fsynced); then its RNG file. Returns the entries of
        every file this rank wrote, digested from what is on disk."""
        path = self.storage.root / ckpt
        dcp.save(self._train_state(), storage_writer=dcp.FileSystemWriter(path, thread_count=self.config.num_files),
                 process_group=self.coord.group)
        body = json.dumps({"rank": self.rank, "rng": _encode_rng(rng_state())}).encode()
        self.storage.write_atomic(f"{ckpt}/{rank_file(self.rank)}", body)
        mine = [rank_file(self.rank), *(p.name for p in path.glob(f"__{self.rank}_*.distcp"))]
        if self.rank == 0:
            mine.append(".metadata")
        return {name: self._entry(f"{ckpt}/{name}") for name in mine}

    def _entry(self, key: str) -> manifest.FileEntry:
        size = self.storage.size(key)
        digest = manifest.new_digest()
        if size:
            digest.update(self.storage.map_private(key))
        return manifest.FileEntry(size, digest.hexdigest())

    def _commit(self, step: int, kind: str, ckpt: str, files: dict, outcome: SaveOutcome, started: float) -> None:
        outcome.checkpoint_id = str(uuid.uuid4())
        meta = {"format": layout.FORMAT, "framework": FRAMEWORK, "writer": WRITER, "step": step, "kind": kind,
                "world_size": self.world_size, "created_at": datetime.now(timezone.utc).isoformat(),
                "checkpoint_id": outcome.checkpoint_id, "extra": self.state.extra or {},
                "scheduler": self.state.scheduler.state_dict() if self.state.scheduler is not None else None,
                "sampler": self.state.sampler.state_dict() if self.state.sampler is not None else None}
        man, created = manifest.commit(self.storage, ckpt, step, files, meta)
        outcome.committed = True
        outcome.save_s = time.monotonic() - started
        channel.append_checkpoint_report(self.config.checkpoints_file, protocol.CheckpointReport(
            checkpoint_id=outcome.checkpoint_id, step=step, uri=outcome.uri, bytes=man.total_bytes,
            manifest_digest=man.digest, kind=kind, committed_at=created, save_s=outcome.save_s, stall_s=outcome.save_s,
            reference_loss=None, persist_s=outcome.save_s))
        rotate(self.storage, self.config.keep)

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
        target = self._train_state()
        try:
            dcp.load(target, storage_reader=dcp.FileSystemReader(self.storage.root / name), process_group=self.coord.group)
        except (Exception, dcp.CheckpointException) as exc:
            raise IncompatibleCheckpointError(f"checkpoint {ref.uri} does not fit rank {self.rank}'s model: "
                                              f"{_reason(exc, self.rank)}; nothing was deleted") from None
        set_state_dict(self.state.model, self.state.optimizer or [], model_state_dict=target["model"],
                       optim_state_dict=target.get("optim", {}))
        if self.state.scheduler is not None and meta["scheduler"] is not None:
            self.state.scheduler.load_state_dict(meta["scheduler"])
        if self.state.extra is not None:
            self.state.extra.clear()
            self.state.extra.update(meta["extra"])
        source = self.rank if self.rank < meta["world_size"] else self.rank % meta["world_size"]
        set_rng_state(_decode_rng(json.loads(self.storage.read(ref.key(rank_file(source))))["rng"]))
        self._last_saved_step, self._last_save_at = ref.step, time.monotonic()
        return Resumed(ref.step, ref.uri, skipped)

    def close(self) -> None:
        """Restore the signal handlers (nothing is in flight: saves are synchronous)."""
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers.clear()

    def finish(self, step: int) -> SaveOutcome:
        outcome = self.save(step, kind=protocol.CheckpointKind.FINAL)
        if not outcome.committed:
            raise CheckpointError(f"final checkpoint of step {step} was not committed: {outcome.message}")
        trainer.report(step, force=True)
        return outcome
