"""The DCP writer: `ShardedCheckpointer`'s backend (agents/respawn/checkpoint/manager.py).

torch.distributed.checkpoint writes each rank's part into the step directory, through
our storage layer (agents/respawn/checkpoint/dcp_storage.py), digesting each file as it
is written; each rank adds `rank-<r>.json` (its RNG states); the entries are gathered on
the coordinator's gloo group (a rank gets past that gather only once every rank's part
is durable, and a dead rank fails it); rank 0 commits (agents/respawn/checkpoint/commit.py).
A periodic save is DCP's `async_save`, committed at a later call once the agreed table
shows every rank's part written; a notice, final or asked-for save is written before
the call returns, straight from the live tensors (agents/respawn/checkpoint/sharded.py says more).
"""

from __future__ import annotations

import base64
import json
import time
from concurrent.futures import Future, wait
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

from respawn import protocol

from . import commit, layout, manifest
from .config import CheckpointConfig, SaveOutcome
from .dcp_storage import StorageWriter
from .distributed import Coordinator, pg_timeout_s
from .policy import NOT_YET, SaveClock, all_done
from .reader import CheckpointRef
from .state import rng_state
from .storage import Storage
from .validation import ReferenceLoss

if TYPE_CHECKING:
    from .sharded import ShardedState

FRAMEWORK = "torch-dcp"
WRITER = "torch.distributed.checkpoint"


def rank_file(rank: int) -> str:
    return f"rank-{rank}.json"


def failure_reason(exc: BaseException, rank: int) -> str:
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

    def progress(self) -> tuple[int, int, int]:
        if not self.future.done():
            return 1, NOT_YET, NOT_YET
        if self.future.exception() is not None:
            return 1, NOT_YET, self.step
        return 1, self.step, NOT_YET


class DcpWriter:
    """DCP's planner decides who writes what; a save waits for the one before it."""

    saves_at_any_call = True
    replicas = None  # the memory tier sends the packed writer's snapshot; DCP's staging is its own (docs/memory-tier.md)

    def __init__(self, state: ShardedState, config: CheckpointConfig, storage: Storage, coord: Coordinator,
                 clock: SaveClock):
        self.state = state
        self.config = config
        self.storage = storage
        self.coord = coord
        self.clock = clock
        self.rank, self.world_size = coord.rank, coord.world_size
        self._reference = ReferenceLoss(config.validation) if config.validation is not None and self.rank == 0 else None
        self._inflight: _InFlight | None = None
        # A periodic save's collectives run in DCP's thread, beside the coordinator's on
        # the training thread: a group of their own keeps the two from interleaving.
        self._save_group = (dist.new_group(backend="gloo", timeout=timedelta(seconds=pg_timeout_s()))
                            if coord.distributed else None)

    # --- the manager's calls (agents/respawn/checkpoint/manager.py Backend) --------------------
    def progress(self) -> tuple[int, int, int]:
        return (0, NOT_YET, NOT_YET) if self._inflight is None else self._inflight.progress()

    def before_decision(self) -> None:
        pass

    def after_call(self) -> None:
        pass

    def busy(self, table: list[list[int]] | None) -> bool:
        return False  # a new save settles the one in flight first

    def settle(self, table: list[list[int]]) -> None:
        if self._inflight is not None and all_done(table, self._inflight.step):
            self._settle(table)

    def start_periodic(self, step: int) -> SaveOutcome:
        return self._save(step, protocol.CheckpointKind.PERIODIC)

    def save_now(self, step: int, kind: str, deadline: float | None) -> SaveOutcome:
        """DCP's save cannot be stopped midway: `deadline` is the agent's to enforce."""
        return self._save(step, kind)

    def drain(self) -> None:
        if self._inflight is not None:
            self._settle()

    def close(self) -> None:
        pass

    # --- saving ----------------------------------------------------------------------------
    def _begin(self, step: int, kind: str, committed_before: bool | None) -> tuple[SaveOutcome, str, bool]:
        """What every save does first, on every rank together: its outcome, folder, and
        whether that step is already committed (else its folder is cleaned for the write)."""
        if self._inflight is not None:
            self._settle()  # one save at a time: the one in flight is finished first
        ckpt = layout.step_dir(step)
        outcome = SaveOutcome(step, kind, committed_before, self.storage.url_for(ckpt))
        self.clock.saved(step, time.monotonic())
        if self.coord.broadcast_from_zero(CheckpointRef(self.storage, ckpt).is_committed()):
            outcome.committed, outcome.message = True, "already committed"
            return outcome, ckpt, True
        if self.rank == 0:
            commit.stage(self.storage, ckpt, whole=True)  # an abandoned attempt's files (perhaps of another world size)
        self.coord.gather_objects(None)  # the directory is clean before anyone writes into it
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
                future = dcp.async_save(self.train_state(), storage_writer=writer, process_group=self._save_group,
                                        no_dist=not self.coord.distributed)
            else:
                dcp.save(self.train_state(), storage_writer=writer, process_group=self.coord.group)
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
            self.coord.exchange([0, 0, 0, *inflight.progress()])
        self._inflight = None
        self._commit_together(inflight)

    def _commit_together(self, inflight: _InFlight) -> None:
        """Rank 0 commits once every rank says its part is durable; every rank learns the outcome."""
        outcome, error = inflight.outcome, inflight.future.exception()
        entries = inflight.writer.entries() if error is None else failure_reason(error, self.rank)
        parts = self.coord.gather_objects(entries)
        failed = {r: p for r, p in enumerate(parts) if not isinstance(p, dict)}
        if failed:
            outcome.message = "; ".join(f"rank {r} did not write its part: {p}" for r, p in failed.items())
        elif self.rank == 0:
            try:
                commit.commit(self.storage, self.config, inflight.ckpt, {n: e for p in parts for n, e in p.items()},
                              inflight.meta, outcome, inflight.started, stall_s=outcome.stall_s or None)
            except Exception as exc:
                outcome.message = f"commit of step {inflight.step} failed: {type(exc).__name__}: {exc}"
        outcome.committed, outcome.checkpoint_id = self.coord.broadcast_from_zero((outcome.committed, outcome.checkpoint_id))
        outcome.save_s = time.monotonic() - inflight.started
        if not outcome.committed:
            commit.not_committed(self.storage, outcome, outcome.message or "rank 0 did not commit")
        commit.announce(outcome)

    def train_state(self) -> dict:
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

    def _prepared(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        # Built inside record(): a factory that cannot be used ends in reference_error, not in a failed save.
        self._reference.prepare()
        return weights

