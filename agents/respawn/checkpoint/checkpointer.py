"""The Checkpointer: called by the training loop every step, it decides when to save.

Save choices, each a deliberate one:
- Periodic saves are two-phase: the snapshot (copy into reused host buffers), then
  the persist in a background thread, paced over `pace_fraction` of the interval at
  the lowest CPU priority, then the commit (data files, state.json, MANIFEST.json,
  LATEST). Only part of the snapshot stalls training: the tensors that only the
  optimizer writes (weights, optimizer moments) are copied by the persist thread
  beside the next step's forward/backward, and the optimizer's next `step()` waits
  for that copy (a step pre-hook) before it writes them; the rest (buffers, RNG,
  scheduler, sampler) is copied at once. `overlap_snapshot=False` copies it all at once.
  Some of the optimizer's moments (`write_live_fraction` of the state) are not
  copied at all: the persist writes them straight from the live tensors before
  that step, so a save needs less extra host memory than the state's size.
  A state on CUDA is copied on a side stream instead (agents/respawn/checkpoint/snapshot.py):
  save() only queues the copies, and the optimizer's next step makes its own kernels
  wait for them on the GPU, without holding up the host.
- At most one persist is in flight. A periodic save that comes due while one is
  still running is DEFERRED: the in-flight persist finishes undisturbed (so an
  older checkpoint always completes) and the save happens at the first step after
  it. The persist's threads run only on cores training leaves idle (SCHED_IDLE),
  so one still running a whole interval after it began (training left it no CPU)
  is finished with training paused, and that wait counts as the save's stall:
  checkpoints never fall further behind than one interval.
- A notice save (`kind="notice"`, or a SIGTERM/stop seen at a step) jumps the
  queue: an in-flight persist of the same step is unpaced and waited for; one of
  an older step is abandoned (it stops within one chunk). The new state is then
  persisted at full speed and committed before the deadline, or abandoned at the
  deadline, leaving the previous checkpoint intact; the outcome says which. Training
  waits for it, so its CPU tensors are written in place, not copied first.
- Signal handlers only set flags; the work happens in the next `save()` call.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone

import torch

from respawn import protocol, trainer
from respawn.envvars import env_float

from . import channel, layout, manifest, persist, signals
from .codec import flatten
from .distributed import Coordinator
from .errors import CheckpointError, ConfigError, IncompatibleCheckpointError, NoticeSaveMissed
from .reader import CheckpointRef, LoadedCheckpoint, committed, load
from .resume import Resumed, choose
from .rotation import remove_torn, rotate
from .snapshot import DeviceCopy, SnapshotBuffers
from .state import TrainState
from .storage import Storage, open_storage
from .storage.local import LocalStorage
from .validation import ReferenceLoss, ValidationSettings, Verdict, judge, mark

DEFAULT_INTERVAL_S = 600.0
FRAMEWORK = "torch"
LOCAL_LIVE_FRACTION = 0.5


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    """How and when to checkpoint. `CheckpointConfig.from_env()` fills the blanks
    from the agent's environment (agents/respawn/protocol.py)."""

    uri: str
    """Storage root of this job's checkpoints: a path, file://, s3://, gs:// or az://."""
    every_steps: int | None = None
    """Save every N steps. When set, it wins over `interval_s`."""
    interval_s: float | None = None
    """Save every T seconds (default 600); changeable at run time with `set_interval`."""
    keep: int = 2
    """Committed checkpoints to keep (>= 2), plus the newest valid one if it is older."""
    num_files: int = 4
    """Data files per rank, written in parallel."""
    pace_fraction: float = 0.5
    """A periodic persist is spread over this fraction of the interval."""
    notice_budget_s: float = 25.0
    """Time a notice save has when neither `save(deadline=)` nor the agent's notice file gives one."""
    agree_every_steps: int = 1
    """In a gang, ranks agree (stop, save now, save due, commit) every this many steps,
    without blocking a step (agents/respawn/checkpoint/distributed.py); a stop seen by one rank
    reaches all within 2 x this - 1 steps. Raise it when steps are short and ranks drift."""
    validation: ValidationSettings | None = None
    """Model and batch factories: reference loss at save, validation on resume."""
    validate_on_resume: bool = True
    resume_from: str | None = None
    """Resume from this checkpoint URI (or an older one if it is invalid) instead of the newest."""
    handle_signals: bool = True
    """SIGTERM -> notice save and stop at the next step; SIGUSR1 -> save at the next step."""
    overlap_snapshot: bool = True
    """Copy the weights and optimizer state of a periodic save beside the next step's
    forward/backward (the TrainState's optimizer waits for it before its next step).
    Turn off if the loop changes weights between a save and the optimizer's next step
    by other means than the optimizer: then CUDA tensors' copies are waited for by the
    training stream's next kernel instead of the optimizer's update."""
    write_live_fraction: float | None = None
    """With `overlap_snapshot`: up to this share of the state, taken from the optimizer's
    moments (never the weights, which the reference loss reads later), is written
    straight from the training state during the next step's forward/backward instead
    of being copied, so a save's extra host memory is about (1 - this) x the state.
    That step's `optimizer.step()` waits for those writes, so the default depends on
    the storage: 0.5 on a local disk (direct I/O takes them at memory speed), 0 (copy
    everything) on an object store, where they would wait for the upload."""
    checkpoints_file: str | None = None
    validations_file: str | None = None
    control_file: str | None = None
    notice_file: str | None = None

    def __post_init__(self):
        if not self.uri:
            raise ConfigError(f"CheckpointConfig.uri is empty: pass a storage URI or set {protocol.ENV_CHECKPOINT_URI}")
        if self.keep < 2:
            raise ConfigError(f"keep={self.keep}: keep at least 2 checkpoints, the newest may still be pending or being written")
        if self.every_steps is not None and self.every_steps < 1:
            raise ConfigError(f"every_steps={self.every_steps} must be >= 1 (or None to save by time)")
        if self.interval_s is not None and self.interval_s <= 0:
            raise ConfigError(f"interval_s={self.interval_s} must be > 0 seconds")
        if self.num_files < 1:
            raise ConfigError(f"num_files={self.num_files} must be >= 1")
        if not 0 < self.pace_fraction <= 1:
            raise ConfigError(f"pace_fraction={self.pace_fraction} must be in (0, 1]")
        if self.write_live_fraction is not None and not 0 <= self.write_live_fraction <= 1:
            raise ConfigError(f"write_live_fraction={self.write_live_fraction} must be in [0, 1]")
        if self.agree_every_steps < 1:
            raise ConfigError(f"agree_every_steps={self.agree_every_steps} must be >= 1")
        if self.notice_budget_s <= 0:
            raise ConfigError(f"notice_budget_s={self.notice_budget_s} must be > 0")

    @classmethod
    def from_env(cls, **overrides) -> "CheckpointConfig":
        env = os.environ
        values = {
            "uri": env.get(protocol.ENV_CHECKPOINT_URI, ""),
            "interval_s": env_float(protocol.ENV_CHECKPOINT_INTERVAL_S),
            "resume_from": env.get(protocol.ENV_RESUME_FROM) or None,
            "checkpoints_file": env.get(protocol.ENV_CHECKPOINTS_FILE) or None,
            "validations_file": env.get(protocol.ENV_VALIDATIONS_FILE) or None,
            "control_file": env.get(protocol.ENV_CONTROL_FILE) or None,
            "notice_file": env.get(protocol.ENV_NOTICE_FILE) or None,
        }
        model_factory = env.get(protocol.ENV_VALIDATION_MODEL_FACTORY)
        batch_factory = env.get(protocol.ENV_VALIDATION_BATCH_FACTORY)
        if model_factory and batch_factory:
            values["validation"] = ValidationSettings(model_factory, batch_factory,
                                                      eval_fn=env.get(protocol.ENV_VALIDATION_EVAL_FN, ""))
        values.update(overrides)
        return cls(**values)


@dataclass
class SaveOutcome:
    step: int
    kind: str
    committed: bool | None  # None while a periodic persist is still in flight
    uri: str
    message: str = ""
    stall_s: float = 0.0
    save_s: float | None = None
    checkpoint_id: str = ""


@dataclass
class _Persist:
    """One in-flight persist: its pacing (mutable: a notice unpaces it), cancel flag,
    and, once `finished`, either this rank's written files or the error."""

    step: int
    kind: str
    pace: persist.Pace
    outcome: SaveOutcome
    meta: dict
    started: float
    cancel: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)
    # The state's own tensors, held until the snapshot is complete: those at `deferred`
    # are still to be copied, the buffers' live ones still to be written, the CUDA ones
    # still read by `device`'s copies. `snapshotted` is set once the host has nothing
    # left to take from them; the optimizer's next step waits for it, and for `device`
    # on the GPU.
    tensors: list | None = None
    deferred: list[int] = field(default_factory=list)
    device: DeviceCopy | None = None
    snapshotted: threading.Event = field(default_factory=threading.Event)
    entries: dict | None = None
    error: BaseException | None = None
    # What the persist's threads cost the loop's steps beside it (taking cores from it):
    # each step's time less the step time before the save, summed (noise cancels out).
    after_s: float = 0.0


# Columns of the table ranks agree on (agents/respawn/checkpoint/distributed.py).
_STOP, _NOW, _DUE, _BUSY, _WRITTEN_STEP, _FAILED_STEP = range(6)


class Checkpointer:
    """Call `load_latest()` once, `save(step)` after every step, `close()` at the end.

        ckpt = Checkpointer(TrainState(model, optimizer, scheduler, sampler=sampler), config)
        for step in range(ckpt.load_latest().step, total_steps):
            train_one_step()
            ckpt.save(step + 1)
            if ckpt.should_stop:
                break
        else:
            ckpt.finish(total_steps)  # final save, validation, export
        ckpt.close()

    `step` counts completed steps: resuming from a checkpoint saved with
    `save(1200)` gives `load_latest().step == 1200` and the loop runs step 1200 next.
    """

    def __init__(self, state: TrainState, config: CheckpointConfig, framework: str = FRAMEWORK, *,
                 hook_optimizer: bool = True):
        self.state = state
        self.config = config
        self.framework = framework  # in state.json: a resume by another framework refuses it (DESIGN §11)
        self.storage: Storage = open_storage(config.uri)
        self._live_fraction = config.write_live_fraction
        if self._live_fraction is None:
            self._live_fraction = LOCAL_LIVE_FRACTION if isinstance(self.storage, LocalStorage) else 0.0
        self.coord = Coordinator(config.agree_every_steps)
        self.rank = self.coord.rank
        self._buffers = SnapshotBuffers(config.num_files)
        self._reference = ReferenceLoss(config.validation) if config.validation is not None and self.rank == 0 else None
        self._interval_s = config.interval_s or DEFAULT_INTERVAL_S
        self._control = channel.ControlFile(config.control_file)
        self._inflight: _Persist | None = None
        self._last_save_at = time.monotonic()
        self._last_saved_step = 0
        self._last_committed_step = -1
        self._step_time_s: float | None = None  # a step's own time, no save beside it
        self._step_ended_at: float | None = None  # when the last save() returned: the loop's step began
        self._waited_in_step = 0.0  # of this step's time, the optimizer's wait for the snapshot
        self._stop_seen = False
        self._now_seen = False
        self.should_stop = False
        self.last_outcome: SaveOutcome | None = None
        self._overlap = config.overlap_snapshot and state.optimizer is not None
        self._step_hook = None
        if self._overlap and hook_optimizer:
            self._step_hook = state.optimizer.register_step_pre_hook(self._before_optimizer_step)
        self._restore_signals = signals.install(self._on_stop, self._on_checkpoint_now) if config.handle_signals else (lambda: None)

    # --- signals and run-time settings -------------------------------------------------
    def _on_stop(self, signum, frame) -> None:
        self._stop_seen = True  # only a flag: the save happens at the next safe point

    def _on_checkpoint_now(self, signum, frame) -> None:
        self._now_seen = True

    def before_optimizer_step(self) -> None:
        """With `hook_optimizer=False`: call it after forward/backward, right before the
        optimizer changes the weights (Lightning runs forward/backward inside
        `optimizer.step(closure)`, where a step pre-hook would wait before them)."""
        self._before_optimizer_step(None, (), {})

    def _before_optimizer_step(self, optimizer, args, kwargs) -> None:
        """The weights are about to change: the in-flight snapshot must hold them first."""
        job = self._inflight
        if job is not None and job.device is not None:
            job.device.hold_update()
        if job is not None and not job.snapshotted.is_set():
            started = time.monotonic()
            job.snapshotted.wait()
            waited = time.monotonic() - started
            job.outcome.stall_s += waited
            self._waited_in_step += waited

    def request_stop(self) -> None:
        """Same as SIGTERM: notice save at the next `save()` call, then `should_stop`."""
        self._stop_seen = True

    def request_checkpoint(self) -> None:
        """Same as SIGUSR1: a save at the next `save()` call."""
        self._now_seen = True

    def set_interval(self, seconds: float) -> None:
        if seconds <= 0:
            raise ConfigError(f"checkpoint interval must be > 0 seconds, got {seconds}")
        self._interval_s = seconds

    @property
    def interval_s(self) -> float:
        return self._interval_s

    @property
    def host_buffer_bytes(self) -> int:
        """Host memory the snapshot buffers hold (allocated at the first save, then
        reused): the state's size less what is written live."""
        return self._buffers.nbytes

    # --- the per-step entry point ------------------------------------------------------
    def save(self, step: int, kind: str | None = None, deadline: float | datetime | None = None) -> SaveOutcome | None:
        """Called after every step. Saves when due or asked (signal, `kind`) and returns
        the outcome of a save started in this call (a periodic one is still in flight:
        `committed` is None), else None. `deadline` (notice saves): epoch seconds or an
        aware datetime; default: the agent's notice file, else `notice_budget_s`."""
        if kind not in (None, *protocol.CheckpointKind.ALL):
            raise ValueError(f"save kind {kind!r} is not one of {protocol.CheckpointKind.ALL}")
        self._track_step_time()
        new_interval = self._control.new_interval()
        if new_interval:
            self._interval_s = new_interval
        self._finish_late_persist()
        outcome = self._decide(step, kind, deadline, self.coord.agreed(self._status_row(step)))
        self.coord.share(self._status_row(step))
        self._step_ended_at = time.monotonic()
        return outcome

    def _decide(self, step: int, kind: str | None, deadline, table: list[list[int]] | None) -> SaveOutcome | None:
        """Act on the ranks' agreed table; in a gang it is None on the steps that read
        none, when only the caller's own `kind` can start a save."""
        if table is not None:
            self._settle_inflight(table)
        # Alone, a persist that just finished frees the slot at once; in a gang all
        # ranks must decide from the same table.
        busy = any(row[_BUSY] for row in table) if table is not None and self.coord.world_size > 1 else self._inflight is not None
        stop = table is not None and any(row[_STOP] for row in table)
        if stop or kind in (protocol.CheckpointKind.NOTICE, protocol.CheckpointKind.FINAL):
            if stop and not self.should_stop:
                # A gang's other ranks stop because one rank was asked to: their agents
                # learn from this that the trainer's exit 0 is a stop, not the end of training.
                trainer.report(step, force=True, stopped=True)
            self._stop_seen = False
            self.should_stop = self.should_stop or stop
            outcome = self._save_now(step, kind or protocol.CheckpointKind.NOTICE, self._deadline(deadline, kind))
            if kind is None and not outcome.committed:
                # A stop's save that did not commit is a missed notice: the loop must not end
                # as if it had stopped cleanly (docs/signals.md).
                raise NoticeSaveMissed(outcome.message)
            return outcome
        wanted = kind == protocol.CheckpointKind.PERIODIC or table is not None and (any(row[_NOW] for row in table) or table[0][_DUE])
        if wanted and not busy and step != self._last_saved_step:
            self._now_seen = False
            return self._start_periodic(step)
        return None

    def _finish_late_persist(self) -> None:
        job = self._inflight
        if job is None or job.kind != protocol.CheckpointKind.PERIODIC or job.finished.is_set():
            return
        if time.monotonic() < job.started + self._period_s():
            return
        started = time.monotonic()
        job.pace.finish_by = None
        job.finished.wait()  # training paused: the persist's idle-priority threads get the cores
        job.outcome.stall_s += time.monotonic() - started

    def _track_step_time(self) -> None:
        """The step that just ended, from the loop's side (save() excluded): its time goes to
        the step time, or, while a periodic persist runs beside it, its excess over that
        time to the persist's after-effect, part of the stall it reports."""
        if self._step_ended_at is not None:
            dt = time.monotonic() - self._step_ended_at
            job = self._inflight
            if job is not None and job.kind == protocol.CheckpointKind.PERIODIC and self._step_time_s is not None:
                job.after_s += dt - self._waited_in_step - self._step_time_s
            else:
                self._step_time_s = dt if self._step_time_s is None else 0.9 * self._step_time_s + 0.1 * dt
        self._waited_in_step = 0.0

    def _due(self, step: int) -> bool:
        if self.config.every_steps:
            return step - self._last_saved_step >= self.config.every_steps
        return time.monotonic() - self._last_save_at >= self._interval_s

    def _status_row(self, step: int) -> list[int]:
        job = self._inflight
        finished = job is not None and job.finished.is_set()
        written = job.step if finished and job.error is None else -1
        failed = job.step if finished and job.error is not None else -1
        return [int(self._stop_seen), int(self._now_seen), int(self._due(step)), int(job is not None), written, failed]

    def _settle_inflight(self, table: list[list[int]]) -> None:
        """Retire a finished persist. Alone, the persist thread has committed already;
        in a gang, rank 0 commits here once every rank has written the step, and any
        rank's failure abandons the step on all ranks (all decide from the same table)."""
        job = self._inflight
        if job is None:
            return
        if self.coord.world_size == 1:
            if job.finished.is_set():
                self._inflight = None
            return
        if any(row[_FAILED_STEP] == job.step for row in table):
            job.cancel.set()
            job.finished.wait()
            job.outcome.committed = False
            job.outcome.message = job.outcome.message or f"step {job.step} abandoned: another rank failed to write its shard"
            self._inflight = None
        elif all(row[_WRITTEN_STEP] == job.step for row in table):
            if self.rank == 0:
                self._try_commit(job)
            self._inflight = None

    def _deadline(self, deadline: float | datetime | None, kind: str | None) -> float | None:
        """A notice deadline as monotonic time: given, else `notice_deadline(config)`."""
        if kind == protocol.CheckpointKind.FINAL and deadline is None:
            return None
        if deadline is None:
            return notice_deadline(self.config)
        if isinstance(deadline, datetime):
            deadline = deadline.timestamp()
        return time.monotonic() + deadline - time.time()

    # --- saving ------------------------------------------------------------------------
    def _snapshot(self, step: int, kind: str, overlap: bool) -> tuple[dict, float, list, list[int], DeviceCopy | None]:
        """Copy the state into the host buffers but for its live tensors and, with
        `overlap`, the tensors only the optimizer writes: returns the state's tensors,
        the indices the persist thread still has to copy and the CUDA copies in flight."""
        started = time.monotonic()
        tensors: list[torch.Tensor] = []
        skeleton = flatten(self.state.state_dict(), tensors)
        if kind == protocol.CheckpointKind.PERIODIC:
            owned, live = self._overlap_plan(tensors)
        else:  # a notice or final save, written before save() returns
            owned, live = frozenset(), self._written_in_place(tensors)
        later, device = self._buffers.copy_in(tensors, owned if overlap else frozenset(), live)
        meta = {
            "format": layout.FORMAT, "framework": self.framework, "step": step, "kind": kind, "world_size": self.coord.world_size,
            "created_at": datetime.now(timezone.utc).isoformat(),
            "skeleton": skeleton, "slots": [s.to_json() for s in self._buffers.slots],
        }
        if self._reference is not None:
            self._reference.prepare()
            meta["validation"] = self.config.validation.to_json()
        return meta, time.monotonic() - started, tensors, later, device

    def _overlap_plan(self, tensors: list[torch.Tensor]) -> tuple[frozenset[int], frozenset[int]]:
        """Indices of the host tensors that only the optimizer's step writes (the
        parameters it updates and its per-parameter state), and those of them to
        write live: the largest moments, up to `write_live_fraction` of the state."""
        optimizer = self.state.optimizer
        if not self._overlap:
            return frozenset(), frozenset()
        params = {p.data_ptr() for group in optimizer.param_groups for p in group["params"]}
        moments = {t.data_ptr() for per_param in optimizer.state.values()
                   for t in per_param.values() if isinstance(t, torch.Tensor)}
        owner = params | moments
        owned = [i for i, t in enumerate(tensors) if t.numel() and t.data_ptr() in owner]
        if any(t.is_cuda for t in tensors):
            # The host has nothing to copy after save() returns, so the optimizer never
            # waits on it: the CPU tensors of such a state (AdamW's step counts) are copied
            # at once, and no tensor is written live (the host does not hold the CUDA ones).
            return frozenset(i for i in owned if tensors[i].is_cuda), frozenset()
        budget = self._live_fraction * sum(t.numel() * t.element_size() for t in tensors)
        live = []
        for i in sorted(owned, key=lambda i: -tensors[i].numel() * tensors[i].element_size()):
            nbytes = tensors[i].numel() * tensors[i].element_size()
            if tensors[i].data_ptr() in moments and tensors[i].is_contiguous() and nbytes <= budget:
                live.append(i)
                budget -= nbytes
        return frozenset(owned), frozenset(live)

    @staticmethod
    def _written_in_place(tensors: list[torch.Tensor]) -> frozenset[int]:
        """A notice or final save is written before save() returns, training paused, so
        its CPU tensors need no copy: each contiguous one is written, and read by the
        reference loss, from the state itself. A 1 GiB state's copy took 0.37 s of a
        notice's window on 2 cores, and its weights' copy (for the reference loss) up to
        1.1 s once the page cache had filled the memory the buffers had to take back."""
        return frozenset(i for i, t in enumerate(tensors) if not t.is_cuda and t.is_contiguous() and t.numel())

    def _saved_weights(self, meta: dict, tensors: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """The model's weights as saved: their copies in the snapshot buffers, or the
        state's own tensors where the save writes them in place (training waits for it)."""
        views = self._buffers.views
        indices = {name: ref["__tensor__"] for name, ref in meta["skeleton"]["model"].items()
                   if isinstance(ref, dict) and "__tensor__" in ref}
        return {name: tensors[i] if views[i] is None else views[i] for name, i in indices.items()}

    def _new_job(self, step: int, kind: str, pace: persist.Pace, overlap: bool = False) -> _Persist:
        started = time.monotonic()
        meta, stall, tensors, deferred, device = self._snapshot(step, kind, overlap)
        outcome = SaveOutcome(step, kind, None, self.storage.url_for(layout.step_dir(step)), stall_s=stall)
        self.last_outcome = outcome
        self._last_save_at = time.monotonic()
        self._last_saved_step = step
        job = _Persist(step, kind, pace, outcome, meta, started, tensors=tensors, deferred=deferred, device=device)
        if not deferred and not self._buffers.live:
            job.snapshotted.set()
        return job

    def _period_s(self) -> float:
        """Seconds between periodic saves, as configured now."""
        if self.config.every_steps and self._step_time_s:
            return self.config.every_steps * self._step_time_s
        return self._interval_s

    def _start_periodic(self, step: int) -> SaveOutcome:
        interval = self._period_s()
        pace = persist.Pace(low_priority=True)
        job = self._new_job(step, protocol.CheckpointKind.PERIODIC, pace, overlap=True)
        pace.finish_by = time.monotonic() + self.config.pace_fraction * interval
        self._inflight = job
        threading.Thread(target=self._run_persist, args=(job,), name=f"ckpt-persist-{step}", daemon=True).start()
        return job.outcome

    def _run_persist(self, job: _Persist) -> None:
        try:
            self._write_rank_files(job)
            if self.coord.world_size == 1:
                self._try_commit(job)
        except BaseException as exc:  # kept on the job: wait() raises it, the outcome says it
            self._record_failure(job, exc)
        finally:
            job.snapshotted.set()  # whatever happened, the optimizer must not wait forever
            job.finished.set()

    @staticmethod
    def _record_failure(job: _Persist, exc: BaseException) -> None:
        job.error = exc
        job.outcome.committed = False
        job.outcome.message = f"{job.kind} save of step {job.step} did not complete: {type(exc).__name__}: {exc}"

    def _write_rank_files(self, job: _Persist) -> None:
        ckpt = layout.step_dir(job.step)
        if self.rank == 0:
            # A directory of this step from an abandoned attempt: drop its commit record
            # (manifest first), verdict and claim; data files are replaced by rename as written.
            for name in (layout.MANIFEST, layout.VALIDATION, layout.VALIDATING, layout.STATE):
                self.storage.delete_prefix(f"{ckpt}/{name}")
        names = [layout.data_file(self.rank, i) for i in range(len(self._buffers.buffers))]
        reference = None

        def complete_snapshot():
            nonlocal reference
            self._buffers.copy_some(job.tensors, job.deferred)
            if job.device is not None:
                job.device.wait()
            reference = self._start_reference_loss(job)  # it reads the weights as saved

        def release_live():
            job.tensors = None
            job.snapshotted.set()

        written = persist.write_files(self.storage, [f"{ckpt}/{n}" for n in names], self._buffers.sources(job.tensors),
                                      job.pace, job.cancel, complete_snapshot, release_live)
        if reference is not None:
            reference.join()
        job.entries = {name: written[f"{ckpt}/{name}"] for name in names}
        if self.rank > 0:
            body = job.meta | {"files": {n: e.to_json() for n, e in job.entries.items()}}
            self.storage.write_atomic(f"{ckpt}/{layout.rank_state_file(self.rank)}", json.dumps(body).encode())

    def _start_reference_loss(self, job: _Persist) -> threading.Thread | None:
        """Rank 0 with validation: the reference loss, computed beside the writes."""
        if self._reference is None:
            return None

        tensors = job.tensors  # released once written; the weights' own are read until the loss is known

        def compute():
            if job.pace.low_priority:
                persist.lower_priority()  # a periodic save's forward pass yields to training too
            self._reference.record(job.meta, lambda: self._saved_weights(job.meta, tensors))

        thread = threading.Thread(target=compute, name=f"ckpt-reference-{job.step}", daemon=True)
        thread.start()
        return thread

    def _try_commit(self, job: _Persist) -> None:
        try:
            self._commit(job)
        except BaseException as exc:
            self._record_failure(job, exc)

    def _commit(self, job: _Persist) -> None:
        """Rank 0: state.json, then MANIFEST.json (durable), then LATEST; report; rotate."""
        if job.pace.deadline is not None and time.monotonic() > job.pace.deadline:
            raise persist.PersistCancelled(f"step {job.step} was written but its deadline passed before the commit")
        ckpt = layout.step_dir(job.step)
        files = dict(job.entries)
        for rank in range(1, self.coord.world_size):
            name = layout.rank_state_file(rank)
            raw = self.storage.read(f"{ckpt}/{name}")
            files[name] = manifest.FileEntry(len(raw), manifest.digest_bytes(raw))
            files |= {n: manifest.FileEntry(**e) for n, e in json.loads(raw)["files"].items()}
        # Every rank's writers of this step are closed by now: an unfinished write left
        # here is an earlier, killed attempt's, and would outlive this commit.
        self.storage.discard_unfinished(ckpt)
        # The checkpoint names its own report id, so a verdict reached on it later (on
        # resume, before export) reaches the control plane's record of it.
        job.meta["checkpoint_id"] = job.outcome.checkpoint_id = str(uuid.uuid4())
        man, created = manifest.commit(self.storage, ckpt, job.step, files, job.meta)
        self.storage.discard_unfinished(layout.LATEST)  # a killed earlier commit's, if any
        job.outcome.committed = True
        self._last_committed_step = job.step
        job.outcome.save_s = time.monotonic() - job.started
        job.outcome.stall_s += max(0.0, job.after_s)
        channel.append_checkpoint_report(self.config.checkpoints_file, protocol.CheckpointReport(
            checkpoint_id=job.outcome.checkpoint_id, step=job.step, uri=job.outcome.uri,
            bytes=man.total_bytes, manifest_digest=man.digest, kind=job.kind, committed_at=created,
            save_s=job.outcome.save_s, stall_s=job.outcome.stall_s, reference_loss=job.meta.get("reference_loss"),
            persist_s=job.pace.unpaced_s(job.outcome.save_s)))
        rotate(self.storage, self.config.keep)

    def _save_now(self, step: int, kind: str, deadline: float | None) -> SaveOutcome:
        """Notice/final path: jump the queue, persist at full speed, commit or say why not."""
        job = self._inflight
        if job is not None:
            if job.step == step:
                job.pace.finish_by = None  # the same state is being written: finish it at full speed
                job.pace.deadline = deadline
            else:
                job.cancel.set()  # an older step: abandon it (it stops within one chunk)
            job.finished.wait()
            self._settle_inflight(self.coord.exchange(self._status_row(step)))
        if self._agreed(step == self._last_committed_step):
            outcome = SaveOutcome(step, kind, True, self.storage.url_for(layout.step_dir(step)), "already committed")
            return self._finish_notice(outcome, kind)
        job = self._new_job(step, kind, persist.Pace(deadline=deadline))
        try:
            self._write_rank_files(job)
        except BaseException as exc:
            self._record_failure(job, exc)
        all_written = all(row[0] for row in self.coord.exchange([int(job.error is None)]))
        if all_written and self.rank == 0:
            self._try_commit(job)
        if self._agreed(bool(job.outcome.committed)):
            job.outcome.committed = True
        else:
            job.outcome.committed = False
            if self.rank == 0:
                self.storage.delete_prefix(layout.step_dir(step))
            previous = [r.name for r in committed(self.storage)]
            reason = job.outcome.message or "another rank did not write its shard in time"
            job.outcome.message = f"{reason}; previous checkpoint {previous[-1] if previous else '(none)'} is intact"
        return self._finish_notice(job.outcome, kind)

    def _agreed(self, rank0_value: bool) -> bool:
        """Rank 0's answer, on every rank (so all ranks take the same branch)."""
        return bool(self.coord.exchange([int(rank0_value)])[0][0])

    def _finish_notice(self, outcome: SaveOutcome, kind: str) -> SaveOutcome:
        self.last_outcome = outcome
        print(f"respawn checkpoint: {kind} save of step {outcome.step}: "
              f"{'committed ' + outcome.uri if outcome.committed else outcome.message}", file=sys.stderr, flush=True)
        return outcome

    # --- waiting, closing, finishing ---------------------------------------------------
    def wait(self) -> SaveOutcome | None:
        """Finish the in-flight persist (if any) at full speed (the caller blocks anyway)
        and return its outcome; raise if it failed. In a gang every rank must call it
        together (it settles the commit)."""
        job = self._inflight
        if job is None:
            return self.last_outcome
        job.pace.finish_by = None
        job.finished.wait()
        self._settle_inflight(self.coord.exchange(self._status_row(job.step)))
        if job.error is not None and not isinstance(job.error, persist.PersistCancelled):
            raise CheckpointError(f"checkpoint {job.outcome.uri}: {job.outcome.message}") from job.error
        return job.outcome

    def close(self) -> None:
        """Wait for the in-flight persist and restore the previous signal handlers."""
        try:
            self.wait()
            self.coord.close()
        finally:
            self._restore_signals()
            if self._step_hook is not None:
                self._step_hook.remove()
                self._step_hook = None

    def finish(self, step: int):
        """End of training: final save, validation, export of the weights (safetensors).
        Returns the exported Artifact, or None without validation settings (nothing
        can be exported unvalidated). Rank 0 exports; other ranks return None."""
        outcome = self.save(step, kind=protocol.CheckpointKind.FINAL)
        self.close()
        if not outcome.committed:
            raise CheckpointError(f"final checkpoint of step {step} was not committed: {outcome.message}")
        if self.rank != 0 or self.config.validation is None:
            return None
        return export_final(load(CheckpointRef(self.storage, layout.step_dir(step))), self.config)

    def _record_verdict(self, loaded: LoadedCheckpoint, verdict: Verdict) -> None:
        record_verdict(self.config.validations_file, loaded, verdict)

    # --- resuming ------------------------------------------------------------------------
    def load_latest(self) -> Resumed:
        """Restore the newest usable checkpoint into the TrainState and say which:
        `load_latest().step` is where the loop continues (0 when there is none), and
        `.skipped` the newer checkpoints passed over, with why. Rank 0 picks it
        (validating it first when validation is configured: an invalid one is marked
        and the previous one tried) and every rank loads the same one. Torn
        directories older than the newest committed checkpoint are deleted first."""
        chosen, skipped = None, ()
        if self.rank == 0:
            remove_torn(self.storage)
            validation = self.config.validation if self.config.validate_on_resume else None
            chosen, skipped = choose(self.storage, self.config.resume_from, validation, self._record_verdict, self.framework)
        name, skipped = self.coord.broadcast_from_zero((chosen.ref.name if chosen else None, skipped))
        if name is None:
            return Resumed(0, None, skipped)
        loaded = chosen if self.rank == 0 else load(CheckpointRef(self.storage, name), self.rank)
        try:
            self.state.load_state_dict(loaded.state)
        except (RuntimeError, KeyError, ValueError) as exc:
            raise IncompatibleCheckpointError(f"checkpoint {loaded.ref.uri} does not fit this training state: {exc}") from None
        self.resumed_at(loaded.ref.step)
        return Resumed(loaded.ref.step, loaded.ref.uri, skipped)

    def resumed_at(self, step: int) -> None:
        """The loop continues from committed checkpoint `step`, restored by `load_latest()`
        or by a framework's own resume from a copy of it (agents/respawn/integrations): the next
        periodic save is an interval from now, and a notice at this step saves nothing new."""
        self._last_saved_step = self._last_committed_step = step
        self._last_save_at = time.monotonic()


def notice_deadline(config: CheckpointConfig) -> float:
    """A notice save's deadline as monotonic time: the agent's notice file's (the cloud's
    less the agent's margin: 108 s of AWS's two minutes), else `notice_budget_s` from now."""
    remaining = channel.notice_deadline(config.notice_file)
    return time.monotonic() + (config.notice_budget_s if remaining is None else remaining)


def export_final(loaded: LoadedCheckpoint, config: CheckpointConfig):
    """The final checkpoint validated with `config.validation` (the verdict recorded and
    reported), then its weights exported as safetensors, which refuses all but `valid`;
    the exported Artifact. The agent ships it with its exit report (agents/respawn/protocol.py channel)."""
    from .export import export_weights

    record_verdict(config.validations_file, loaded, judge(loaded, config.validation))
    artifact = export_weights(loaded.ref, weights=loaded.state["model"])
    trainer.report(loaded.ref.step, force=True, artifact_uri=artifact.uri, artifact_digest=artifact.digest)
    return artifact


def record_verdict(validations_file: str | None, loaded: LoadedCheckpoint, verdict: Verdict) -> None:
    """Beside the checkpoint, and to the agent, which reports it: the checkpoint a
    run resumes from or exports was validated here, not by the agent's validator."""
    mark(loaded.ref, verdict)
    if loaded.meta.get("checkpoint_id"):
        channel.append_validation_report(validations_file, loaded.meta["checkpoint_id"],
                                         protocol.ValidationReport(**verdict.to_json()))
