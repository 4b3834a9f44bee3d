"""The packed writer: `Checkpointer`'s backend (agents/respawn/checkpoint/manager.py), which
writes the state's tensors into a few raw data files per rank.

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
- With the memory tier (a gang whose nodes run buddy stores, tiers/replicator.py), the
  same snapshot is sent to the rank's buddy: every periodic save's, and between them,
  every K steps as the gang agrees, a snapshot of its own into the same buffers, taken
  the same way (the optimizer's next step waits only for its copy) and sent in the
  background. Nothing is written live then (the buffers hold the whole state, which the
  replica reads after the step). A save that comes while the buffers are being sent
  cuts the send (within a chunk) and takes them: storage first; the save's snapshot is
  replicated in its stead. A notice save's snapshot goes to the buddy too, beside its
  storage write and at full priority (copied into the buffers first, not written in
  place), and lands before save() returns: should the storage write miss the window,
  the regrouped survivors resume from it. With validation, rank 0's replica carries
  the reference loss of the weights it holds, computed as a save's is: a resume from
  memory is checked against it (checkpointer.Checkpointer._load_from_memory). A job's
  own K is a bound (tiers/pacing.py strict_cadence): a replication due while a persist
  still holds the buffers finishes that persist at full speed first (paced, it would
  hold them for half an interval, and no replication would be made meanwhile), and the
  call after a replication waits for it to land (`hold_replica`).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

import torch

from respawn import protocol

from . import channel, commit, layout, manifest, persist
from .codec import flatten
from .config import CheckpointConfig, SaveOutcome
from .distributed import Coordinator
from .errors import CheckpointError
from .policy import BUSY, FAILED_STEP, NOT_YET, REPLICATED, WRITTEN_STEP, SaveClock
from .snapshot import DeviceCopy, SnapshotBuffers
from .state import TrainState
from .storage import Storage
from .storage.local import LocalStorage
from .tiers.replicator import Replicator
from .tiers.shard import Shard
from .validation import ReferenceLoss

LOCAL_LIVE_FRACTION = 0.5
HOLD_POLL_S = 0.05  # how soon a strict K's wait for a landing sees a notice


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
    # Set once the snapshot is handed to the memory tier's Replicator (or never will be):
    # until then a replication of this step is owed, which a strict K waits for.
    handed: threading.Event = field(default_factory=threading.Event)
    entries: dict | None = None
    error: BaseException | None = None
    # What the persist's threads cost the loop's steps beside it (taking cores from it):
    # each step's time less the step time before the save, summed (noise cancels out).
    after_s: float = 0.0


class PackedWriter:
    """Snapshots into reused host buffers, persists them paced in a thread, commits."""

    saves_at_any_call = False  # a periodic save due while one is in flight waits for the table

    def __init__(self, state: TrainState, config: CheckpointConfig, framework: str, storage: Storage,
                 coord: Coordinator, clock: SaveClock, hook_optimizer: bool, replicas: Replicator | None = None):
        self.state = state
        self.config = config
        self.framework = framework
        self.storage = storage
        self.coord = coord
        self.rank = coord.rank
        self.clock = clock
        self._live_fraction = config.write_live_fraction
        if self._live_fraction is None:
            self._live_fraction = LOCAL_LIVE_FRACTION if isinstance(storage, LocalStorage) else 0.0
        self.replicas = replicas
        if replicas is not None:
            self._live_fraction = 0.0  # a replica is sent after the step: the buffers must hold everything
        self.buffers = SnapshotBuffers(config.num_files)
        self._reference = ReferenceLoss(config.validation) if config.validation is not None and self.rank == 0 else None
        self.inflight: _Persist | None = None
        self._replica_snapshot: _Persist | None = None  # a replication's own snapshot, until its copy is complete
        self._save_cost_s: float | None = None  # the last committed periodic save's stall: what the interval was chosen for
        self.last_committed_step = -1
        self._step_time_s: float | None = None  # a step's own time, no save beside it
        self._step_ended_at: float | None = None  # when the last save() returned: the loop's step began
        self._waited_in_step = 0.0  # of this step's time, the optimizer's wait for the snapshot
        self._overlap = config.overlap_snapshot and state.optimizer is not None
        self._step_hook = None
        if self._overlap and hook_optimizer:
            self._step_hook = state.optimizer.register_step_pre_hook(self.before_optimizer_step)

    def before_optimizer_step(self, *_) -> None:
        """The weights are about to change: the in-flight snapshot must hold them first."""
        for job in (self.inflight, self._replica_snapshot):
            if job is not None and job.device is not None:
                job.device.hold_update()
            if job is not None and not job.snapshotted.is_set():
                started = time.monotonic()
                job.snapshotted.wait()
                waited = time.monotonic() - started
                job.outcome.stall_s += waited
                self._waited_in_step += waited

    # --- the manager's calls (agents/respawn/checkpoint/manager.py Backend) --------------------
    def before_decision(self) -> None:
        self._track_step_time()
        self._finish_late_persist()

    def after_call(self) -> None:
        self._step_ended_at = time.monotonic()

    def progress(self) -> tuple[int, int, int]:
        job = self.inflight
        finished = job is not None and job.finished.is_set()
        written = job.step if finished and job.error is None else NOT_YET
        failed = job.step if finished and job.error is not None else NOT_YET
        return int(job is not None), written, failed

    def busy(self, table: list[list[int]] | None) -> bool:
        # Alone, a persist that just finished frees the slot at once; in a gang all
        # ranks must decide from the same table.
        if table is not None and self.coord.world_size > 1:
            return any(row[BUSY] for row in table)
        return self.inflight is not None

    def settle(self, table: list[list[int]]) -> None:
        """Retire a finished persist. Alone, the persist thread has committed already;
        in a gang, rank 0 commits here once every rank has written the step, and any
        rank's failure abandons the step on all ranks (all decide from the same table)."""
        job = self.inflight
        if job is None:
            return
        if self.coord.world_size == 1:
            if job.finished.is_set():
                self.inflight = None
            return
        if any(row[FAILED_STEP] == job.step for row in table):
            job.cancel.set()
            job.finished.wait()
            job.outcome.committed = False
            job.outcome.message = job.outcome.message or f"step {job.step} abandoned: another rank failed to write its shard"
            self.inflight = None
        elif all(row[WRITTEN_STEP] == job.step for row in table):
            if self.rank == 0:
                self._try_commit(job, self._tiers(job.step, [row[REPLICATED] for row in table]))
            self.inflight = None

    def _exchange(self) -> list[list[int]]:
        """Every rank's progress now (a blocking gather: the flags are the manager's, and stay
        set until the next shared row), and its newest landed replica."""
        return self.coord.exchange([0, 0, 0, *self.progress(), 0, self._landed(), 0])

    def _landed(self) -> int:
        return self.replicas.landed if self.replicas is not None else -1

    def _tiers(self, step: int, landed: list[int]) -> tuple[str, ...]:
        """Where `step` is held as it commits: the memory tier too when every rank's newest
        replica on both its stores is of that very step (a newer one settled drops it)."""
        whole = self.replicas is not None and all(s == step for s in landed)
        return protocol.CheckpointTier.ALL if whole else (protocol.CheckpointTier.STORAGE,)

    def _finish_late_persist(self) -> None:
        job = self.inflight
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
        the step time, or, while a periodic persist or a replication runs beside it (they
        take CPU and memory bandwidth from it), its excess over that time to the after-effect
        of the one in flight, part of the stall it reports (the replication's sets K)."""
        if self._step_ended_at is not None:
            dt = time.monotonic() - self._step_ended_at
            job = self.inflight if self.inflight is not None and not self.inflight.finished.is_set() else None
            if job is None and self.replicas is not None and self.replicas.busy:
                job = self._replica_snapshot
            if job is not None and job.kind == protocol.CheckpointKind.PERIODIC and self._step_time_s is not None:
                job.after_s += dt - self._waited_in_step - self._step_time_s
            else:
                self._step_time_s = dt if self._step_time_s is None else 0.9 * self._step_time_s + 0.1 * dt
        self._waited_in_step = 0.0

    def _period_s(self) -> float:
        """Seconds between periodic saves, as configured now."""
        if self.config.every_steps and self._step_time_s:
            return self.config.every_steps * self._step_time_s
        return self.clock.interval_s

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
        elif self._replicates(kind):  # the buddy is sent the buffers: they must hold all of it
            owned, live = frozenset(), frozenset()
        else:  # a notice or final save, written before save() returns
            owned, live = frozenset(), self._written_in_place(tensors)
        later, device = self.buffers.copy_in(tensors, owned if overlap else frozenset(), live)
        meta = {
            "format": layout.FORMAT, "framework": self.framework, "step": step, "kind": kind, "world_size": self.coord.world_size,
            "created_at": datetime.now(timezone.utc).isoformat(),
            "skeleton": skeleton, "slots": [s.to_json() for s in self.buffers.slots],
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
        views = self.buffers.views
        indices = {name: ref["__tensor__"] for name, ref in meta["skeleton"]["model"].items()
                   if isinstance(ref, dict) and "__tensor__" in ref}
        return {name: tensors[i] if views[i] is None else views[i] for name, i in indices.items()}

    def _new_job(self, step: int, kind: str, pace: persist.Pace, overlap: bool = False) -> _Persist:
        started = time.monotonic()
        if self.replicas is not None:
            self.replicas.give_up()  # the buffers are the save's: a send in flight stops within a chunk
        meta, stall, tensors, deferred, device = self._snapshot(step, kind, overlap)
        outcome = SaveOutcome(step, kind, None, self.storage.url_for(layout.step_dir(step)), stall_s=stall)
        self.clock.saved(step, time.monotonic())
        job = _Persist(step, kind, pace, outcome, meta, started, tensors=tensors, deferred=deferred, device=device)
        if not deferred and not self.buffers.live:
            job.snapshotted.set()
        return job

    def start_periodic(self, step: int) -> SaveOutcome:
        interval = self._period_s()
        pace = persist.Pace(low_priority=True)
        job = self._new_job(step, protocol.CheckpointKind.PERIODIC, pace, overlap=True)
        pace.finish_by = time.monotonic() + self.config.pace_fraction * interval
        self.inflight = job
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
            job.handed.set()
            job.finished.set()

    @staticmethod
    def _record_failure(job: _Persist, exc: BaseException) -> None:
        job.error = exc
        job.outcome.committed = False
        job.outcome.message = f"{job.kind} save of step {job.step} did not complete: {type(exc).__name__}: {exc}"

    def _write_rank_files(self, job: _Persist) -> None:
        ckpt = layout.step_dir(job.step)
        if self.rank == 0:
            commit.stage(self.storage, ckpt, whole=False)  # data files are replaced by rename as written
        names = [layout.data_file(self.rank, i) for i in range(len(self.buffers.buffers))]
        reference = None

        def complete_snapshot():
            nonlocal reference
            self.buffers.copy_some(job.tensors, job.deferred)
            if job.device is not None:
                job.device.wait()
            reference = self._start_reference_loss(job)  # it reads the weights as saved
            if self._replicates(job.kind):
                def shard() -> Shard:  # with the reference loss: a resume from memory is validated too
                    if reference is not None:
                        reference.join()
                    return self._shard(job.step, job.meta)

                self.replicas.start(job.step, shard, None, idle=job.kind == protocol.CheckpointKind.PERIODIC,
                                    landed=self._notice_landed if job.kind == protocol.CheckpointKind.NOTICE else None)
            job.handed.set()

        def release_live():
            job.tensors = None
            job.snapshotted.set()

        written = persist.write_files(self.storage, [f"{ckpt}/{n}" for n in names], self.buffers.sources(job.tensors),
                                      job.pace, job.cancel, complete_snapshot, release_live)
        if reference is not None:
            reference.join()
        job.entries = {name: written[f"{ckpt}/{name}"] for name in names}
        if self.rank > 0:
            body = job.meta | {"files": {n: e.to_json() for n, e in job.entries.items()}}
            self.storage.write_atomic(f"{ckpt}/{layout.rank_state_file(self.rank)}", json.dumps(body).encode())

    def _replicates(self, kind: str) -> bool:
        """Whether a save's snapshot goes to the buddy as it goes to storage: a periodic
        save's, and a notice save's, beside its storage write: the survivors of a regroup
        resume from it should that write miss the window (tiers/restore.py)."""
        return self.replicas is not None and kind in (protocol.CheckpointKind.PERIODIC, protocol.CheckpointKind.NOTICE)

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

    def _try_commit(self, job: _Persist, tiers: tuple[str, ...] = (protocol.CheckpointTier.STORAGE,)) -> None:
        try:
            self._commit(job, tiers)
        except BaseException as exc:
            self._record_failure(job, exc)

    def _commit(self, job: _Persist, tiers: tuple[str, ...]) -> None:
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
        job.outcome.stall_s += max(0.0, job.after_s)
        commit.commit(self.storage, self.config, ckpt, files, job.meta, job.outcome, job.started,
                      stall_s=job.outcome.stall_s, pace=job.pace, tiers=tiers)
        self.last_committed_step = job.step
        if job.kind == protocol.CheckpointKind.PERIODIC:
            self._save_cost_s = job.outcome.stall_s

    def save_now(self, step: int, kind: str, deadline: float | None) -> SaveOutcome:
        """Notice/final path: jump the queue, persist at full speed, commit or say why not.
        Training waits for it, so its CPU tensors are written in place, not copied first."""
        if kind == protocol.CheckpointKind.NOTICE:
            self._hand_over_notice()
        job = self.inflight
        if job is not None:
            if job.step == step:
                job.pace.finish_by = None  # the same state is being written: finish it at full speed
                job.pace.deadline = deadline
            else:
                job.cancel.set()  # an older step: abandon it (it stops within one chunk)
            job.finished.wait()
            self.settle(self._exchange())
        if self._agreed(step == self.last_committed_step):
            uri = self.storage.url_for(layout.step_dir(step))
            if self._replicates(kind):
                self._await_replica(step, deadline)  # the periodic save's, of this very step
            return commit.announce(SaveOutcome(step, kind, True, uri, "already committed"))
        job = self._new_job(step, kind, persist.Pace(deadline=deadline))
        try:
            self._write_rank_files(job)
        except BaseException as exc:
            self._record_failure(job, exc)
        if self._replicates(kind):
            # The replica, sent beside, mostly lands first (the faster tier): the commit waits
            # a little for it so its manifest can record both tiers, but never more than half
            # the window left, so a slow send never costs storage's commit its window.
            self.replicas.wait(None if deadline is None else max(0.0, (deadline - time.monotonic()) / 2))
        rows = self.coord.exchange([int(job.error is None), self._landed()])
        if all(row[0] for row in rows) and self.rank == 0:
            self._try_commit(job, self._tiers(step, [row[1] for row in rows]))
        if self._agreed(bool(job.outcome.committed)):
            job.outcome.committed = True
        else:
            if self.rank == 0:
                self.storage.delete_prefix(layout.step_dir(step))
            commit.not_committed(self.storage, job.outcome, job.outcome.message or "another rank did not write its shard in time")
        if self._replicates(kind):
            self._await_replica(step, deadline)
        return commit.announce(job.outcome)

    def _await_replica(self, step: int, deadline: float | None) -> None:
        """A notice save's replica, sent beside its storage write: lands before the trainer
        exits (its thread dies with it), or the window closes first."""
        self.replicas.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _notice_landed(self, step: int) -> None:
        """Said the moment it lands, not once storage's write is done: a storage write that
        misses the window is killed with the trainer, and the log must still say where the
        notice step went (the spare, or the survivors, resume from it)."""
        print(f"respawn checkpoint: notice save of step {step}: in the memory tier ({self.replicas.where})",
              file=sys.stderr, flush=True)

    def _hand_over_notice(self) -> None:
        """A spare booted during the notice takes this node's place (the agent's notice file
        names its store): the notice save's snapshot goes there, beside the storage write,
        instead of to this node's store and its buddy's, which go with this gang. A job
        without the tier gets a replicator for it: its ranks' shards are marked as one run
        by the notice itself, the spare's store holding nothing else."""
        handover = channel.notice_handover(self.config.notice_file)
        if handover is None:
            return
        address, token, node = handover
        if self.replicas is None:
            self.replicas = Replicator(self.rank, [], gang="notice")
        self.replicas.hand_over((address, token), node)

    def _agreed(self, rank0_value: bool) -> bool:
        """Rank 0's answer, on every rank (so all ranks take the same branch)."""
        return bool(self.coord.exchange([int(rank0_value)])[0][0])

    # --- the memory tier ------------------------------------------------------------------------
    def replica_due(self, step: int) -> bool:
        """K steps since the last replication began by the call that acts on this answer
        (rank 0's decides for the gang, `agree_every` calls later)."""
        if self.replicas is None:
            return False
        every = self.replicas.every_steps(step_s=self._step_time_s, save_cost_s=self._save_cost_s,
                                          interval_s=self._period_s())
        return step + self.coord.agree_every - self.replicas.started_step >= every

    def replicate(self, step: int) -> None:
        """Snapshot into the buffers and send to the buddy in the background, unless the
        buffers are taken (a persist still writing, whose snapshot went to the buddy at its
        start; a send still in flight: skipped). With a strict K the persist is finished
        first, at full speed: the bound must hold while storage is written too."""
        if self.replicas is None:
            return
        job = self.inflight
        if job is not None and not job.finished.is_set():
            if not self.replicas.strict:
                return
            started = time.monotonic()
            job.pace.finish_by = None
            job.finished.wait()
            job.outcome.stall_s += time.monotonic() - started
        if self.replicas.busy:
            self.replicas.skipped += 1
            return
        started = time.monotonic()
        meta, stall, tensors, deferred, device = self._snapshot(step, protocol.CheckpointKind.PERIODIC, overlap=True)
        job = _Persist(step, protocol.CheckpointKind.PERIODIC, persist.Pace(), SaveOutcome(step, "replica", None, "", stall_s=stall),
                       meta, started, tensors=tensors, deferred=deferred, device=device)
        self._replica_snapshot = job

        def prepare() -> Shard:
            try:
                self.buffers.copy_some(job.tensors, job.deferred)
                if job.device is not None:
                    job.device.wait()
                tensors = job.tensors
            finally:
                job.tensors = None
                job.snapshotted.set()
            if self._reference is not None:  # from the copies, as a storage save's (a resume from memory checks it)
                persist.lower_priority()
                self._reference.record(meta, lambda: self._saved_weights(meta, tensors))
            return self._shard(step, meta)

        self.replicas.start(step, prepare, lambda: job.outcome.stall_s + max(0.0, job.after_s))

    def settle_replicas(self, step: int) -> None:
        if step > self.replicas.settled_step:
            self.replicas.settle(step)

    def hold_replica(self, step: int, stop: Callable[[], bool]) -> None:
        """A strict K: the call `lag` calls after a replication began (a periodic save's
        included, which its persist hands over a moment later) waits until it has landed
        or failed, or until `stop()` (a notice: its save takes the buffers). Training
        waits only as long as a send takes beyond the step it overlapped; the wait counts
        to the stall of the save whose snapshot is being sent."""
        replicas = self.replicas
        if not replicas.strict:
            return
        job = self.inflight
        owed = job if job is not None and self._replicates(job.kind) and not job.handed.is_set() else None
        pending = owed.step if owed is not None else replicas.started_step if replicas.busy else None
        if pending is None or step < pending + replicas.lag:
            return
        started = time.monotonic()
        while not stop():
            if owed is not None and not owed.handed.is_set():
                owed.handed.wait(HOLD_POLL_S)
            elif replicas.busy:
                replicas.wait(HOLD_POLL_S)
            else:
                break
        sent = owed or (job if job is not None and job.step == replicas.started_step else self._replica_snapshot)
        if sent is not None:
            sent.outcome.stall_s += time.monotonic() - started

    def _shard(self, step: int, meta: dict) -> Shard:
        """This rank's files of `step` as a checkpoint would hold them: the buffers (nothing
        is written live with the tier) and its state file."""
        files = {layout.data_file(self.rank, i): memoryview(b.numpy()).cast("B") if b.numel() else memoryview(b"")
                 for i, b in enumerate(self.buffers.buffers)}
        files[layout.rank_state_file(self.rank)] = json.dumps(meta).encode()
        return Shard(self.rank, step, files, {})

    # --- the end -----------------------------------------------------------------------------
    def drain(self) -> SaveOutcome | None:
        """Finish the in-flight persist (if any) at full speed (the caller blocks anyway)
        and return its outcome; raise if it failed. In a gang every rank must call it
        together (it settles the commit)."""
        job = self.inflight
        if job is None:
            return None
        job.pace.finish_by = None
        job.finished.wait()
        self.settle(self._exchange())
        if job.error is not None and not isinstance(job.error, persist.PersistCancelled):
            raise CheckpointError(f"checkpoint {job.outcome.uri}: {job.outcome.message}") from job.error
        return job.outcome

    def close(self) -> None:
        if self.replicas is not None:
            self.replicas.wait()
        if self._step_hook is not None:
            self._step_hook.remove()
            self._step_hook = None
