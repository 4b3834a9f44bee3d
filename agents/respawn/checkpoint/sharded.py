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
   files, then LATEST; reports the checkpoint to the agent and rotates, as
   `Checkpointer` does (DESIGN §6, §11).

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
import sys
import threading
import time
import uuid
import warnings
from concurrent.futures import Future, wait
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_state_dict)

from respawn import protocol, trainer

from . import channel, layout, manifest, signals
from .dcp_storage import StorageReader, StorageWriter
from .checkpointer import DEFAULT_INTERVAL_S, CheckpointConfig, SaveOutcome
from .distributed import Coordinator, pg_timeout_s
from .errors import CheckpointError, CorruptCheckpointError, IncompatibleCheckpointError
from .reader import CheckpointRef, LoadedCheckpoint, _read_json, committed, other_framework
from .resume import Resumed, Skipped
from .rotation import remove_torn, rotate
from .state import rng_state, set_rng_state
from .storage import open_storage
from .validation import ReferenceLoss

FRAMEWORK = "torch-dcp"
WRITER = "torch.distributed.checkpoint"
_STOP, _NOW, _DUE, _WRITTEN = range(4)
# A rank's periodic save in flight, as its row of the coordinator's table says.
WRITING, WRITTEN, FAILED = range(3)


def load_checkpoint(ref: CheckpointRef) -> LoadedCheckpoint:
    """A committed DCP checkpoint read in this one process, without a process group, for
    the validator: every file checked against its manifest, then the model's full
    (unsharded) weights as "model". Another framework's raises IncompatibleCheckpointError."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    man = manifest.verify_all(ref.storage, ref.name)
    meta = _read_json(ref, man, layout.STATE)
    if meta.get("writer") != WRITER:
        raise other_framework(ref.uri, meta.get("framework", "?"), FRAMEWORK)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is unavailable or uninitialized")  # single process is meant
        try:
            state = _load_state_dict_from_keys("model", storage_reader=StorageReader(ref.storage, ref.name))
        except (Exception, dcp.CheckpointException) as exc:
            # Its bytes are the ones written (the digests passed): the check failed, nothing is condemned.
            raise IncompatibleCheckpointError(f"checkpoint {ref.uri}: DCP cannot read its model here: "
                                              f"{_reason(exc, 0)}") from None
    return LoadedCheckpoint(ref, meta, state, man)


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


@dataclass
class _InFlight:
    """One save being written: DCP's future (done once this rank's part is durable) and
    what its commit needs."""

    step: int
    ckpt: str
    writer: StorageWriter
    future: Future
    started: float
    meta: dict | None
    outcome: SaveOutcome

    def state(self) -> int:
        if not self.future.done():
            return WRITING
        return FAILED if self.future.exception() is not None else WRITTEN


class ShardedCheckpointer:
    """`load_latest()` once, `save(step)` after every step, `close()` at the end; every
    rank calls each together. Saves every `config.every_steps` steps (or every
    `interval_s` as rank 0's clock says), at a stop (SIGTERM on any rank,
    `request_stop()`) or when `save(step, kind=...)` asks."""

    def __init__(self, state: ShardedState, config: CheckpointConfig):
        self.state = state
        self.config = config
        self.storage = open_storage(config.uri)
        self.coord = Coordinator(config.agree_every_steps)
        self.rank, self.world_size = self.coord.rank, self.coord.world_size
        self._check_same_model()
        self._reference = ReferenceLoss(config.validation) if config.validation is not None and self.rank == 0 else None
        self._last_save_at = time.monotonic()
        self._last_saved_step = -1
        self._stop_seen = self._now_seen = False
        self.should_stop = False
        self.last_outcome: SaveOutcome | None = None
        self._inflight: _InFlight | None = None
        # A periodic save's collectives run in DCP's thread, beside the coordinator's on
        # the training thread: a group of their own keeps the two from interleaving.
        self._save_group = (dist.new_group(backend="gloo", timeout=timedelta(seconds=pg_timeout_s()))
                            if self.coord.distributed else None)
        self._restore_signals = signals.install(self._on_stop, self._on_checkpoint_now) if config.handle_signals else (lambda: None)

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
        asked = kind is not None  # a final or notice save of a step saved periodically still reports its kind
        table = self.coord.agreed(self._row(step))
        if table is not None and self._inflight is not None and all(row[_WRITTEN] != WRITING for row in table):
            self._settle(table)
        outcome = None
        stop = table is not None and any(row[_STOP] for row in table)
        if stop:
            self.should_stop = True
            kind = protocol.CheckpointKind.NOTICE
        elif kind is None and (self.config.every_steps and self._due(step) or table is not None
                               and (any(row[_NOW] for row in table) or table[0][_DUE])):
            kind = protocol.CheckpointKind.PERIODIC
        if kind is not None and (asked or step != self._last_saved_step):
            self._stop_seen = self._now_seen = False
            outcome = self._save(step, kind)
        self.coord.share(self._row(step))
        return outcome

    def _row(self, step: int) -> list[int]:
        written = WRITTEN if self._inflight is None else self._inflight.state()
        return [int(self._stop_seen), int(self._now_seen), int(self._due(step)), written]

    def _begin(self, step: int, kind: str, committed_before: bool | None) -> tuple[SaveOutcome, str, bool]:
        """What every save does first, on every rank together: its outcome, folder, and
        whether that step is already committed (else its folder is cleaned for the write)."""
        if self._inflight is not None:
            self._settle()  # one save at a time: the one in flight is finished first
        ckpt = layout.step_dir(step)
        outcome = SaveOutcome(step, kind, committed_before, self.storage.url_for(ckpt))
        self._last_saved_step, self._last_save_at = step, time.monotonic()
        if self.coord.broadcast_from_zero(CheckpointRef(self.storage, ckpt).is_committed()):
            outcome.committed, outcome.message = True, "already committed"
            return outcome, ckpt, True
        if self.rank == 0:
            self.storage.delete_prefix(ckpt)  # an abandoned attempt's files (perhaps of another world size)
        self._gather_objects(None)  # the directory is clean before anyone writes into it
        return outcome, ckpt, False

    def _save(self, step: int, kind: str) -> SaveOutcome:
        """A periodic save: the state is copied to host memory (DCP's staging) and the step
        goes on while DCP writes it in its thread; it commits at a later `save()` call, once
        the coordinator's table shows every rank's part written (or at the next save,
        `close()`). A notice, final or asked-for save is written before the call returns."""
        started = time.monotonic()
        background = kind == protocol.CheckpointKind.PERIODIC
        outcome, ckpt, done = self._begin(step, kind, None if background else False)
        if done:
            return outcome
        writer = StorageWriter(self.storage, ckpt, thread_count=self.config.num_files)
        future: Future = Future()
        meta = None
        try:
            meta = self._meta(step, outcome, self._full_weights())
            self._write_rank_file(ckpt, writer)
            if background:
                future = dcp.async_save(self._train_state(), storage_writer=writer, process_group=self._save_group,
                                        no_dist=not self.coord.distributed)
            else:
                dcp.save(self._train_state(), storage_writer=writer, process_group=self.coord.group)
                future.set_result(None)
        except (Exception, dcp.CheckpointException) as exc:
            future = Future()
            future.set_exception(exc)
        inflight = _InFlight(step, ckpt, writer, future, started, meta, outcome)
        if background:
            outcome.stall_s = time.monotonic() - started
            self._inflight = inflight
        else:
            self._commit_together(inflight)
            outcome.stall_s = outcome.save_s
        return outcome

    def _settle(self, table: list[list[int]] | None = None) -> None:
        """Commit (or give up) the periodic save in flight, on every rank together: at a
        table showing every rank's part written or failed, else after waiting for it."""
        inflight = self._inflight
        if table is None:
            wait([inflight.future])
            # Every rank's part written or failed, and a share still pending finished first
            # (one collective at a time on the coordinator's group).
            self.coord.exchange([0, 0, 0, inflight.state()])
        self._inflight = None
        self._commit_together(inflight)

    def _commit_together(self, inflight: _InFlight) -> None:
        """Rank 0 commits once every rank says its part is durable; every rank learns the outcome."""
        outcome, error = inflight.outcome, inflight.future.exception()
        entries = inflight.writer.entries() if error is None else _reason(error, self.rank)
        parts = self._gather_objects(entries)
        failed = {r: p for r, p in enumerate(parts) if not isinstance(p, dict)}
        if failed:
            outcome.message = "; ".join(f"rank {r} did not write its part: {p}" for r, p in failed.items())
        elif self.rank == 0:
            try:
                self._commit(inflight.step, inflight.ckpt, {n: e for p in parts for n, e in p.items()}, outcome,
                             inflight.started, inflight.meta)
            except Exception as exc:
                outcome.message = f"commit of step {inflight.step} failed: {type(exc).__name__}: {exc}"
        outcome.committed, outcome.checkpoint_id = self.coord.broadcast_from_zero((outcome.committed, outcome.checkpoint_id))
        outcome.save_s = time.monotonic() - inflight.started
        if not outcome.committed:
            previous = [r.name for r in committed(self.storage)]
            outcome.message = (outcome.message or "rank 0 did not commit") + \
                f"; previous checkpoint {previous[-1] if previous else '(none)'} is intact"
        print(f"respawn checkpoint: {outcome.kind} save of step {outcome.step}: "
              f"{'committed ' + outcome.uri if outcome.committed else outcome.message}", file=sys.stderr, flush=True)
        self.last_outcome = outcome

    def _train_state(self) -> dict:
        model, optim = get_state_dict(self.state.model, self.state.optimizer or [])
        return {"model": model, "optim": optim} if self.state.optimizer is not None else {"model": model}

    def _full_weights(self) -> dict[str, torch.Tensor] | None:
        """With validation, the model's unsharded weights on rank 0's CPU (None on the other
        ranks): every rank must call it, since an FSDP2/DTensor model all-gathers its shards.
        CPU tensors come back as the live ones, not copies: the reference loss only reads
        them (no_grad, eval mode) before training's next step, within the save's stall."""
        if self.config.validation is None:
            return None
        weights = get_model_state_dict(self.state.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return weights if self.rank == 0 else None

    def _write_rank_file(self, ckpt: str, writer: StorageWriter) -> None:
        """This rank's RNG states, as they are at the step saved (training goes on)."""
        body = json.dumps({"rank": self.rank, "rng": _encode_rng(rng_state())}).encode()
        self.storage.write_atomic(f"{ckpt}/{rank_file(self.rank)}", body)
        writer.fs.written[f"{ckpt}/{rank_file(self.rank)}"] = manifest.FileEntry(len(body), manifest.digest_bytes(body))

    def _meta(self, step: int, outcome: SaveOutcome, weights: dict[str, torch.Tensor] | None) -> dict | None:
        """Rank 0: state.json's body, taken at the step saved, with the reference loss of
        its weights (scored now: a DDP model's weights are its live tensors)."""
        if self.rank != 0:
            return None
        meta = {"format": layout.FORMAT, "framework": FRAMEWORK, "writer": WRITER, "step": step, "kind": outcome.kind,
                "world_size": self.world_size, "created_at": datetime.now(timezone.utc).isoformat(),
                "extra": self.state.extra or {},
                "scheduler": self.state.scheduler.state_dict() if self.state.scheduler is not None else None,
                "sampler": self.state.sampler.state_dict() if self.state.sampler is not None else None}
        if self._reference is not None:
            meta["validation"] = self.config.validation.to_json()
            self._reference.record(meta, lambda: self._prepared(weights))
        return json.loads(json.dumps(meta))  # a copy: training changes the scheduler's and sampler's state meanwhile

    def _commit(self, step: int, ckpt: str, files: dict, outcome: SaveOutcome, started: float, meta: dict) -> None:
        outcome.checkpoint_id = meta["checkpoint_id"] = str(uuid.uuid4())
        man, created = manifest.commit(self.storage, ckpt, step, files, meta)
        outcome.committed = True
        outcome.save_s = time.monotonic() - started
        channel.append_checkpoint_report(self.config.checkpoints_file, protocol.CheckpointReport(
            checkpoint_id=outcome.checkpoint_id, step=step, uri=outcome.uri, bytes=man.total_bytes,
            manifest_digest=man.digest, kind=outcome.kind, committed_at=created, save_s=outcome.save_s,
            stall_s=outcome.stall_s or outcome.save_s, reference_loss=meta.get("reference_loss"),
            persist_s=outcome.save_s))
        rotate(self.storage, self.config.keep)

    def _prepared(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        # Built inside record(): a factory that cannot be used ends in reference_error, not in a failed save.
        self._reference.prepare()
        return weights

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
            dcp.load(target, storage_reader=StorageReader(self.storage, name), process_group=self.coord.group)
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
        """Commit the periodic save in flight (every rank together) and restore the signal handlers."""
        if self._inflight is not None:
            self._settle()
        self.coord.close()
        self._restore_signals()

    def finish(self, step: int) -> SaveOutcome:
        outcome = self.save(step, kind=protocol.CheckpointKind.FINAL)
        if not outcome.committed:
            raise CheckpointError(f"final checkpoint of step {step} was not committed: {outcome.message}")
        trainer.report(step, force=True)
        return outcome
