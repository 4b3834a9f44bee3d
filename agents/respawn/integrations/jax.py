"""JAX / Flax / optax with Orbax, spot-safe: a loop adds three calls.

    ckpt = SpotSafe(CheckpointConfig.from_env())      # from respawn.integrations.jax import SpotSafe
    restored = ckpt.restore(state)                     # state: any pytree (params, opt_state, PRNG key, ...)
    state, position = restored.state, restored.extra.get("position", 0)
    for step in range(restored.step, total):
        state = train_step(state, batch_at(position)); position += 1
        ckpt.save(step + 1, state, extra={"position": position})
        if ckpt.should_stop:
            ckpt.stop(step + 1)                        # exits 0, `stopped` in the status file
    ckpt.finish(total, state)

- Saves are Orbax's own async ones (`AsyncCheckpointer` + `StandardCheckpointHandler`):
  `save()` returns once Orbax holds its host copy; its background thread writes. Our
  commit follows Orbax's own finalize (DESIGN §6): state.json (framework `jax`, step,
  `extra`, the reference loss), then MANIFEST.json listing every file Orbax wrote with
  its size and digest, durable, then LATEST; a report to the agent; rotation keeping
  the last K and never the newest valid one before a successor validates.
- A notice (SIGTERM, SIGUSR1 for a save now) only sets a flag: the next `save()` (a step
  boundary) lets an in-flight async save finish, saves the state of that step, commits
  it and sets `should_stop`. Python's default SIGTERM action would end the process
  under Orbax's writer thread, losing the save in flight and every step since the last
  commit; Orbax's own preemption save needs `jax.distributed`.
- `restore(template)` picks the newest committed checkpoint (torn directories are never
  read: they have no manifest), verifies every file's digest, validates it first when
  validation is configured, and restores through Orbax into the template's structure,
  dtypes and shardings: params, optimizer state, PRNG keys (typed or raw) and the
  `extra` dict (the data position) come back exactly; the step is the checkpoint's.
- Validation (`respawn.checkpoint.validate`, the agent's validator process): the model
  factory returns a template of the saved pytree, the batch factory the fixed batch, and
  `eval_fn(state, batch) -> float` the loss. There is no default loss for JAX.

Local storage only (a path or file://): Orbax writes the files itself. One process
(`jax.process_count() == 1`). jax and orbax are imported here only (extra `respawn-ml[jax]`).
"""

from __future__ import annotations

import json
import os
import queue
import statistics
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from respawn import protocol
from respawn.checkpoint import channel, layout, manifest, signals
from respawn.checkpoint.checkpointer import CheckpointConfig, SaveOutcome, notice_deadline, record_verdict
from respawn.checkpoint.errors import (CheckpointError, ConfigError, CorruptCheckpointError, EvalError, FactoryError,
                                      IncompatibleCheckpointError)
from respawn.checkpoint.reader import CheckpointRef, LoadedCheckpoint, list_checkpoints, ref_from_uri
from respawn.checkpoint.rotation import remove_torn, rotate
from respawn.checkpoint.storage import open_storage
from respawn.checkpoint.storage.local import LocalStorage
from respawn.checkpoint.validation import (ValidationSettings, Verdict, _call, compare, evaluate, mark, reference_loss,
                                         settings_for)

from ._common import report_stop, require_supported

require_supported("orbax-checkpoint")  # before its import: the 0.12 `args` API is the one saved through

import jax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402

FRAMEWORK = "jax"
ORBAX_DIR = "orbax"  # Orbax's own checkpoint, inside step-N/
ARRAYS_FILE = "arrays.bin"  # a notice save's leaves, raw (see SpotSafe._write_arrays)


@dataclass
class Restored:
    """What `restore()` gives the loop: the state to continue from, the step it is at
    (0 and the template itself when there was nothing to resume from), and `extra`."""

    state: object
    step: int
    extra: dict = field(default_factory=dict)
    uri: str | None = None


@dataclass
class _Save:
    """A save on its way to its commit: its state.json body (with `started` and `stall_s`,
    taken out at the commit), and what the steps beside its background write lost against
    the step time before it (a periodic save's after-effect, part of the stall it reports)."""

    step: int
    meta: dict
    after_s: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)


class SpotSafe:
    """Orbax async saves committed under Respawn's protocol; see the module's text."""

    def __init__(self, config: CheckpointConfig | None = None):
        self.config = config or CheckpointConfig.from_env()
        self.storage = open_storage(self.config.uri)
        if not isinstance(self.storage, LocalStorage):
            raise ConfigError(f"respawn.integrations.jax writes through Orbax to a local path; {self.config.uri} is not one")
        if jax.process_count() > 1:
            raise ConfigError("respawn.integrations.jax runs one process; this one is part of a jax.distributed gang")
        self._orbax = ocp.AsyncCheckpointer(ocp.StandardCheckpointHandler())
        self._control = channel.ControlFile(self.config.control_file)
        self._interval_s = self.config.interval_s or 600.0
        self._last_save_at = time.monotonic()
        self._last_saved_step, self._last_committed_step = 0, -1
        # One committer for the object's life: a thread started per save would make the
        # step wait for its start, on the blocking path.
        self._inflight: _Save | None = None  # a periodic save handed to the committer, not yet done
        self._written: queue.SimpleQueue[_Save | None] = queue.SimpleQueue()
        self._committer = threading.Thread(target=self._commit_periodic, name="respawn-jax-commit", daemon=True)
        self._committer.start()
        # Step times with no save in flight, the after-effect's yardstick: a median, not the
        # torch Checkpointer's running mean, which a step that compiles would swamp for long.
        self._quiet_steps: deque[float] = deque(maxlen=16)
        self._step_ended_at: float | None = None
        self._stop_seen = self._now_seen = False
        self.should_stop = False
        self.last_uri: str | None = None
        self._restore_signals = signals.install(self._on_stop, self._on_checkpoint_now) if self.config.handle_signals else (lambda: None)

    def _on_stop(self, signum, frame) -> None:
        self._stop_seen = True  # only a flag: Orbax's writer thread keeps writing, the save happens at the next step

    def _on_checkpoint_now(self, signum, frame) -> None:
        self._now_seen = True

    def request_stop(self) -> None:
        """Same as SIGTERM: a notice save at the next `save()`, then `should_stop`."""
        self._stop_seen = True

    # --- resuming --------------------------------------------------------------------
    def restore(self, template) -> Restored:
        """The newest usable checkpoint restored into `template`'s structure (see the
        module's text); `Restored(template, 0)` when there is none. A checkpoint of
        another framework raises IncompatibleCheckpointError, deleting nothing."""
        loaded = choose(self.config)
        if loaded is None:
            return Restored(template, 0)
        state = restore_state(loaded, template)
        self._last_saved_step = self._last_committed_step = loaded.ref.step
        self._last_save_at = time.monotonic()
        return Restored(state, loaded.ref.step, loaded.meta.get("extra") or {}, loaded.ref.uri)

    # --- saving ----------------------------------------------------------------------
    def save(self, step: int, state, extra: dict | None = None, kind: str | None = None) -> bool:
        """Called after every step with the state at that step boundary: saves when due
        or asked; True when a save started. `extra` (JSON: the data position, ...) is
        stored in state.json and handed back by `restore()`."""
        began = time.monotonic()
        self._track_step_time(began)
        try:
            return self._save(step, state, extra, kind, began)
        finally:
            self._step_ended_at = time.monotonic()

    def _track_step_time(self, now: float) -> None:
        """The step that just ended, from the loop's side (save() excluded): a quiet step's
        time, or, while a periodic save is written beside it, its excess over the quiet
        steps' to that save's after-effect (the torch Checkpointer counts it the same way)."""
        if self._step_ended_at is None:
            return
        took, job = now - self._step_ended_at, self._inflight
        if job is not None and self._quiet_steps:
            job.after_s += took - statistics.median(self._quiet_steps)
        elif job is None:
            self._quiet_steps.append(took)

    def _save(self, step: int, state, extra: dict | None, kind: str | None, began: float) -> bool:
        new_interval = self._control.new_interval()
        if new_interval:
            self._interval_s = new_interval
        if self._stop_seen or kind in (protocol.CheckpointKind.NOTICE, protocol.CheckpointKind.FINAL):
            stop = self._stop_seen
            self._stop_seen = False
            self._save_now(step, state, extra, kind or protocol.CheckpointKind.NOTICE)
            self.should_stop = self.should_stop or stop
            return True
        due = (self._now_seen or kind == protocol.CheckpointKind.PERIODIC or
               (step - self._last_saved_step >= self.config.every_steps if self.config.every_steps else
                time.monotonic() - self._last_save_at >= self._interval_s))
        if not due or step == self._last_saved_step or self._inflight is not None:
            return False
        self._now_seen = False
        job = self._start(step, state, extra, protocol.CheckpointKind.PERIODIC, began)
        job.meta["stall_s"] = time.monotonic() - began  # all of this call the step waited for, the hand-off included
        self._inflight = job
        self._written.put(job)
        return True

    def _commit_periodic(self) -> None:
        """The committer: each periodic save once Orbax has written it. A failed one is
        reported on stderr and costs nothing else: training goes on, its directory never
        gets a manifest, and the next save is due as usual."""
        while (job := self._written.get()) is not None:
            try:
                self._commit_when_written(job, None)
            finally:  # whatever happened, the loop's next save and wait() must not wait on it
                self._inflight = None
                job.done.set()

    def _start(self, step: int, state, extra: dict | None, kind: str, began: float) -> _Save:
        """Begin Orbax's async save of `state` into step-N/orbax."""
        meta = self._meta(step, state, extra, kind)
        self._orbax.save(self.storage.root / layout.step_dir(step) / ORBAX_DIR, args=ocp.args.StandardSave(state))
        return self._saved(meta, began)

    def _write_arrays(self, step: int, state, extra: dict | None, kind: str, began: float) -> _Save:
        """A notice save: every leaf's bytes into one file, fsynced, by this thread. Orbax's
        writer (tensorstore, its metadata files) costs 4-7x a raw write of the same bytes
        here, and a notice's time is the window's; restore_state reads either."""
        meta = self._meta(step, state, extra, kind)
        folder = self.storage.root / layout.step_dir(step)
        folder.mkdir(parents=True, exist_ok=True)
        meta["arrays"], offset, digest = [], 0, manifest.new_digest()
        with open(folder / ARRAYS_FILE, "wb") as f:
            for leaf in jax.tree.leaves(state):
                data = np.asarray(jax.device_get(_key_data(leaf)), order="C")
                meta["arrays"].append({"dtype": data.dtype.name, "shape": list(data.shape), "offset": offset})
                f.write(data.reshape(-1).data)
                digest.update(data.reshape(-1).data)  # here, not read back at the commit
                offset += data.nbytes
            f.flush()
            os.fsync(f.fileno())
        del meta["orbax"]
        meta["written"] = {ARRAYS_FILE: manifest.FileEntry(offset, digest.hexdigest())}
        return self._saved(meta, began)

    def _meta(self, step: int, state, extra: dict | None, kind: str) -> dict:
        """The state.json body of a save of `state` at `step` (its reference loss included)."""
        # Nothing newer than the newest commit is anyone else's: a directory of this step
        # is a killed earlier attempt's, and Orbax will not write over it.
        self.storage.delete_prefix(layout.step_dir(step))
        meta = {"format": layout.FORMAT, "framework": FRAMEWORK, "step": step, "kind": kind, "world_size": 1,
                "created_at": datetime.now(timezone.utc).isoformat(), "extra": json.loads(json.dumps(extra or {})),
                "orbax": ORBAX_DIR}
        if self.config.validation is not None:
            meta["validation"] = self.config.validation.to_json()
            # The loss of the state as it is in memory now; validation reproduces it from the files.
            try:
                meta["reference_loss"] = evaluate(self.config.validation, state, _call(self.config.validation.batch_factory))
            except (EvalError, FactoryError) as exc:
                meta["reference_error"] = str(exc)
        return meta

    def _saved(self, meta: dict, began: float) -> _Save:
        meta["started"], meta["stall_s"] = began, time.monotonic() - began
        self._last_saved_step = meta["step"]
        self._last_save_at = time.monotonic()
        return _Save(meta["step"], meta)

    def _commit_when_written(self, job: _Save, deadline: float | None) -> BaseException | None:
        """Commit once the save's files are all in place; the exception when it failed."""
        try:
            self._orbax.wait_until_finished()  # Orbax's finalize: its files renamed into place
            if deadline is not None and time.monotonic() > deadline:
                raise CheckpointError(f"step {job.step} was written but its notice deadline passed before the commit")
            self._commit(job)
        except Exception as exc:
            print(f"respawn jax: save of step {job.step} failed: {exc}", file=sys.stderr, flush=True)
            return exc
        return None

    def _commit(self, job: _Save) -> None:
        """state.json, then MANIFEST.json (durable), then LATEST; report; rotate."""
        step, meta = job.step, job.meta
        ckpt = layout.step_dir(step)
        base = self.storage.root / ckpt
        known = meta.pop("written", {})  # entries of files this process wrote and fsynced itself
        files = {name: known.get(name) or _entry(base / name)
                 for name in sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file())}
        meta["checkpoint_id"] = str(uuid.uuid4())
        started, blocked_s = meta.pop("started"), meta.pop("stall_s")
        state_bytes = json.dumps(meta).encode()
        # A plain write: nothing reads this directory before its manifest, so no rename is
        # needed, and one fsync of each directory below then covers every name in it.
        with open(base / layout.STATE, "wb") as f:
            f.write(state_bytes)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dirs(base)
        files[layout.STATE] = manifest.FileEntry(len(state_bytes), manifest.digest_bytes(state_bytes))
        created = datetime.now(timezone.utc).isoformat()
        raw = manifest.encode(step, files, created)
        self.storage.write_atomic(f"{ckpt}/{layout.MANIFEST}", raw)
        self.storage.write_atomic(layout.LATEST, ckpt.encode())
        save_s = time.monotonic() - started  # to LATEST, as the torch Checkpointer counts it
        self._last_committed_step = step
        self.last_uri = self.storage.url_for(ckpt)
        man = manifest.Manifest(step, files, raw)
        channel.append_checkpoint_report(self.config.checkpoints_file, protocol.CheckpointReport(
            checkpoint_id=meta["checkpoint_id"], step=step, uri=self.last_uri, bytes=man.total_bytes,
            manifest_digest=man.digest, kind=meta["kind"], committed_at=created, save_s=save_s,
            stall_s=blocked_s + max(0.0, job.after_s), reference_loss=meta.get("reference_loss")))
        rotate(self.storage, self.config.keep)

    def _save_now(self, step: int, state, extra: dict | None, kind: str) -> None:
        """Notice/final: let the save in flight finish (Orbax cannot cancel one), then
        save this step at full speed and commit it before the deadline, or say why not."""
        deadline = self._deadline(kind)
        self.wait()
        if step == self._last_committed_step:
            print(f"respawn jax: {kind} save of step {step}: already committed", file=sys.stderr, flush=True)
            return
        began = time.monotonic()  # this save's own time, as the torch Checkpointer counts a notice save's
        if kind == protocol.CheckpointKind.NOTICE:
            job = self._write_arrays(step, state, extra, kind, began)
        else:  # the final checkpoint in Orbax's format: what a script's later use of it expects
            job = self._start(step, state, extra, kind, began)
        error = self._commit_when_written(job, deadline)
        if error is not None:
            self.storage.delete_prefix(layout.step_dir(step))
            print(f"respawn jax: {kind} save of step {step} not committed ({error}); "
                  f"the previous checkpoint is intact", file=sys.stderr, flush=True)
        else:
            print(f"respawn jax: {kind} save of step {step}: committed {self.last_uri}", file=sys.stderr, flush=True)

    def _deadline(self, kind: str) -> float | None:
        return None if kind == protocol.CheckpointKind.FINAL else notice_deadline(self.config)

    # --- waiting, stopping, finishing -------------------------------------------------
    def wait(self) -> None:
        """Finish the save in flight, if any (its commit included)."""
        job = self._inflight
        if job is not None:
            job.done.wait()

    def close(self) -> None:
        """Wait for the save in flight and put back the previous signal handlers."""
        try:
            self.wait()
        finally:
            self._written.put(None)
            self._committer.join()
            self._orbax.close()
            self._restore_signals()

    def stop(self, step: int) -> None:
        """After a notice save: tell the agent this exit 0 is a stop, and exit (NoticeSaveMissed
        when the save of `step` did not commit)."""
        self.close()
        committed = step == self._last_committed_step
        report_stop(SaveOutcome(step, protocol.CheckpointKind.NOTICE, committed, self.last_uri or "",
                                "" if committed else f"notice save of step {step} was not committed (its cause is above); "
                                "the previous checkpoint is intact"))
        sys.exit(0)

    def finish(self, step: int, state, extra: dict | None = None) -> None:
        """End of training: a final save of `state`, committed before this returns."""
        self.save(step, state, extra, kind=protocol.CheckpointKind.FINAL)
        self.close()
        if self._last_committed_step != step:
            raise CheckpointError(f"final checkpoint of step {step} was not committed")


def _entry(path: Path) -> manifest.FileEntry:
    """The file's manifest entry, once its bytes are durable: Orbax's small metadata files
    are written without fsync, and the manifest must never name what a crash can take back."""
    digest = manifest.new_digest()
    with open(path, "rb") as f:
        while chunk := f.read(manifest.READ_CHUNK):
            digest.update(chunk)
        os.fsync(f.fileno())
    return manifest.FileEntry(path.stat().st_size, digest.hexdigest())


def _fsync_dirs(base: Path) -> None:
    """Every directory under `base` (Orbax renamed its files and folders into them)."""
    for folder in [base, *(p for p in base.rglob("*") if p.is_dir())]:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def choose(config: CheckpointConfig) -> LoadedCheckpoint | None:
    """The newest usable checkpoint (not after `config.resume_from`), verified, and
    validated first when configured and no verdict is recorded; None when there is none.
    Torn directories go first; one of another framework raises, deleting nothing:
    falling back past it would silently train from older state."""
    storage = open_storage(config.uri)
    remove_torn(storage)
    limit = ref_from_uri(config.resume_from).step if config.resume_from else None
    validation = config.validation if config.validate_on_resume else None
    for ref in reversed(list_checkpoints(storage)):
        verdict = ref.validation() if ref.is_committed() else None
        if limit is not None and ref.step > limit or not ref.is_committed() or (verdict or {}).get("result") == "invalid":
            print(f"respawn jax: skipping {ref.uri}: newer than resume_from, not committed or recorded invalid",
                  file=sys.stderr, flush=True)
            continue
        try:
            loaded = load_checkpoint(ref)
        except CorruptCheckpointError as exc:
            mark(ref, Verdict(False, None, None, str(exc)))
            print(f"respawn jax: skipping {ref.uri}: corrupt: {exc}", file=sys.stderr, flush=True)
            continue
        if validation is not None and (not verdict or verdict.get("result") == "error"):
            verdict_now = judge(loaded, validation)
            record_verdict(config.validations_file, loaded, verdict_now)
            if verdict_now.error:
                raise EvalError(f"cannot validate {ref.uri} to resume from it: {verdict_now.message}")
            if not verdict_now.valid:
                continue
        print(f"respawn jax: resuming at step {ref.step} from {ref.uri}", file=sys.stderr, flush=True)
        return loaded
    return None


def load_checkpoint(ref: CheckpointRef) -> LoadedCheckpoint:
    """A committed JAX checkpoint with every file checked against its manifest (Orbax reads
    them afterwards); `state` stays empty: `restore_state` rebuilds it into a template.
    Another framework's checkpoint raises IncompatibleCheckpointError naming it."""
    man = manifest.verify_all(ref.storage, ref.name)
    if layout.STATE not in man.files:
        raise CorruptCheckpointError(f"checkpoint {ref.uri}: its manifest does not list {layout.STATE}")
    meta = json.loads(ref.storage.read(ref.key(layout.STATE)))
    written_by = meta.get("framework", "torch")  # checkpoints before DESIGN §11 are the torch loop's
    if written_by != FRAMEWORK:
        raise IncompatibleCheckpointError(
            f"checkpoint {ref.uri} was written by framework {written_by!r}, not by the JAX integration ({FRAMEWORK}): "
            f"it cannot be restored into a JAX state; point the job at another checkpoint root (nothing was deleted)")
    return LoadedCheckpoint(ref, meta, {}, man)


def restore_state(loaded: LoadedCheckpoint, template):
    """The checkpoint's state restored into `template`'s structure, dtypes and shardings."""
    folder = Path(loaded.ref.storage.root) / loaded.ref.name
    try:
        if "arrays" in loaded.meta:
            return _read_arrays(folder / ARRAYS_FILE, loaded.meta["arrays"], template)
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        with ocp.StandardCheckpointer() as checkpointer:
            return checkpointer.restore(folder / loaded.meta.get("orbax", ORBAX_DIR), abstract)
    except (ValueError, KeyError, TypeError) as exc:
        raise IncompatibleCheckpointError(f"checkpoint {loaded.ref.uri} does not fit this training state: {exc}") from None


def _key_data(leaf):
    """A typed PRNG key's raw words (what is written); any other leaf as it is."""
    return jax.random.key_data(leaf) if _is_key(leaf) else leaf


def _is_key(leaf) -> bool:
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _read_arrays(path: Path, index: list[dict], template):
    """A notice save's leaves, each given the template leaf's sharding (and key type)."""
    leaves, treedef = jax.tree.flatten(template)
    if len(leaves) != len(index):
        raise ValueError(f"it holds {len(index)} arrays, the state has {len(leaves)}")
    data = np.fromfile(path, dtype=np.uint8)
    restored = []
    for i, (leaf, entry) in enumerate(zip(leaves, index)):
        dtype, shape = np.dtype(entry["dtype"]), tuple(entry["shape"])
        expected = jax.eval_shape(_key_data, leaf)
        if (shape, dtype) != (expected.shape, expected.dtype):
            raise ValueError(f"array {i} is {dtype}{list(shape)}, the state's is {expected.dtype}{list(expected.shape)}")
        count = int(np.prod(shape))
        array = data[entry["offset"]: entry["offset"] + count * dtype.itemsize].view(dtype).reshape(shape)
        array = jax.device_put(array, leaf.sharding) if isinstance(leaf, jax.Array) else array
        restored.append(jax.random.wrap_key_data(array, impl=jax.random.key_impl(leaf)) if _is_key(leaf) else array)
    return jax.tree.unflatten(treedef, restored)


def judge(loaded: LoadedCheckpoint, settings: ValidationSettings | None = None, device=None) -> Verdict:
    """respawn.checkpoint.validation.judge for a JAX checkpoint (on JAX's default device:
    the training one): a check that could not run is an `error` verdict naming why."""
    try:
        return validate_loaded(loaded, settings)
    except (FactoryError, EvalError, IncompatibleCheckpointError) as exc:
        return Verdict.failed_check(exc, loaded.meta.get("reference_loss"))


def validate_loaded(loaded: LoadedCheckpoint, settings: ValidationSettings | None) -> Verdict:
    """respawn.checkpoint.validation's verdict for a JAX checkpoint: the model factory gives
    the template pytree, `eval_fn(state, batch)` the loss compared with the reference
    (settings default to the ones stored at save)."""
    settings = settings_for(loaded.ref.uri, loaded.meta, settings)
    if not settings.eval_fn:
        raise FactoryError("a JAX checkpoint is validated with an eval_fn(state, batch) -> float; none is named")
    reference = reference_loss(loaded.ref.uri, loaded.meta)
    state = restore_state(loaded, _call(settings.model_factory))
    return compare(loaded.ref.uri, evaluate(settings, state, _call(settings.batch_factory)), reference, settings.tolerance)
