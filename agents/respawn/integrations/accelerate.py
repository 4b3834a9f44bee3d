"""Accelerate's `save_state` / `load_state`, committed under Respawn's protocol.

    from respawn.integrations.accelerate import SpotSafeState
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    spot = SpotSafeState(accelerator)                 # CheckpointConfig.from_env() by default
    start = spot.resume()                             # the newest usable checkpoint loaded: its step, else 0
    for step, batch in enumerate(accelerator.skip_first_batches(loader, start), start):
        ...forward, backward, optimizer.step(), scheduler.step()...
        trainer.report(step + 1, loss.item())         # each step's loss, for the agent and preflight
        if spot.step(step + 1):                       # saves when due or on a notice; True: stop now
            return
    spot.finish(total)                                # final save; with validation, validated and exported

- A save is Accelerate's own `save_state` into a local staging folder (what `load_state`
  restores: models, optimizers, schedulers, scalers, its RNG states, registered
  objects). Its files are then written to the checkpoint root as `step-N/`, side by
  side and digested as they are written (agents/respawn/checkpoint/persist.py), and committed
  by the commit sequence every checkpointer uses (agents/respawn/checkpoint/commit.py: state.json naming framework
  `accelerate`, MANIFEST.json last, LATEST), reported to the agent, rotated (DESIGN §6).
- Validation as for the Checkpointer: with validation factories, each save stores the
  reference loss of the first prepared model (the weights `save_state` writes as
  model.safetensors, or pytorch_model.bin) at that step boundary. The agent's validator
  process reads the weights back from that file (`load_checkpoint`); `resume()` validates
  the checkpoint it picks first and falls back past an invalid one; `finish()` validates
  the final checkpoint and exports its weights. An eval_fn that raises or gives no
  finite number makes the verdict `error`: nothing is condemned or deleted.
- SIGTERM (the agent's notice) only sets a flag: the next `step()` makes the notice save
  and returns True; the script returns and exits 0, `stopped` in the status file. SIGUSR1
  (the agent's "checkpoint now") makes the next `step()` save; the agent's control file
  changes the interval.
- The notice deadline (the agent's notice file, else `notice_budget_s`) bounds what is
  ours, not `save_state`: Accelerate's save is synchronous, in the training thread, and
  has no way to stop it midway. A `save_state` that ends past the deadline commits
  nothing (the agent's kill at the deadline ends one that has not ended); the copy to
  the checkpoint root stops at the deadline (checked every 8 MiB), and no commit is made
  past it. A notice save that misses says so, its directory is removed, and the previous
  checkpoint stands.
- `resume()` takes the newest committed checkpoint (or `RESPAWN_RESUME_FROM`), verifies
  every file's digest and hands a local copy to `load_state`; a torn directory (no
  manifest) is never picked.

Not here: more than one process (each process's `save_state` writes files, its RNG
states, that the main process never sees) and `automatic_checkpoint_naming` (it ignores
the folder given), both refused. A periodic save is not two-phase: training waits for
all of `save_state`, the reference loss and the copy. A model that Accelerate saves as a
folder (DeepSpeed) is committed file by file, untested, and cannot be validated
(`error`, naming why).
"""

from __future__ import annotations

import io
import mmap
import os
import shutil
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone

import torch
from safetensors.torch import load as safetensors_load

from respawn import protocol
from respawn.checkpoint import channel, commit, layout, manifest, persist, policy, signals
from respawn.checkpoint.checkpointer import (DEFAULT_INTERVAL_S, CheckpointConfig, SaveOutcome, export_final,
                                            notice_deadline)
from respawn.checkpoint.errors import CheckpointError, ConfigError, IncompatibleCheckpointError
from respawn.checkpoint.reader import CheckpointRef, LoadedCheckpoint, other_framework, read_json
from respawn.checkpoint.snapshot import FileSource
from respawn.checkpoint.storage import open_storage
from respawn.checkpoint.validation import ReferenceLoss

from ._common import choose_checkpoint, report_stop, require_supported

FRAMEWORK = "accelerate"
# What save_state names the first prepared model's weights (safe_serialization True, False).
MODEL_FILES = ("model.safetensors", "pytorch_model.bin")


class SpotSafeState:
    def __init__(self, accelerator, config: CheckpointConfig | None = None):
        require_supported("accelerate")
        if accelerator.num_processes > 1:
            raise ConfigError(f"respawn.integrations.accelerate runs one process; this Accelerator has "
                              f"{accelerator.num_processes}: each one's save_state writes files the main one "
                              f"never sees")
        if accelerator.project_configuration.automatic_checkpoint_naming:
            raise ConfigError("respawn.integrations.accelerate names the checkpoints itself; save_state ignores "
                              "the folder it is given under ProjectConfiguration(automatic_checkpoint_naming=True)")
        self.accelerator = accelerator
        self.config = config or CheckpointConfig.from_env()
        self.storage = open_storage(self.config.uri)
        self._reference = ReferenceLoss(self.config.validation) if self.config.validation is not None else None
        self._control = channel.ControlFile(self.config.control_file)
        self._interval_s = self.config.interval_s or DEFAULT_INTERVAL_S
        self.should_stop = False
        self.last_outcome: SaveOutcome | None = None
        self._stop_seen = self._now_seen = False
        self._last_step, self._committed_step, self._last_at = 0, -1, time.monotonic()
        self._restore_signals = signals.install(self._on_stop, self._on_checkpoint_now) if self.config.handle_signals else (lambda: None)

    def _on_stop(self, signum, frame) -> None:
        self._stop_seen = True  # only a flag: the save happens at the next step()

    def _on_checkpoint_now(self, signum, frame) -> None:
        self._now_seen = True

    def resume(self) -> int:
        """Load the newest usable checkpoint into the accelerator (see the module's text);
        its step, else 0. A checkpoint of another framework raises, deleting nothing."""
        loaded = choose_checkpoint(self.config, FRAMEWORK, load_checkpoint)
        if loaded is None:
            return 0
        staging = tempfile.mkdtemp(prefix=f"respawn-accelerate-{loaded.ref.step}-")
        try:
            for name, data in loaded.state["files"].items():
                path = os.path.join(staging, name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(data)
            self.accelerator.load_state(staging)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self._last_step = self._committed_step = loaded.ref.step
        self._last_at = time.monotonic()
        return loaded.ref.step

    def step(self, step: int) -> bool:
        """Call after every optimizer step: saves when due (every_steps / interval_s, or
        SIGUSR1) or after a notice; True once a notice save was made and training must stop."""
        new_interval = self._control.new_interval()
        if new_interval:
            self._interval_s = new_interval
        if self._stop_seen and not self.should_stop:
            self.should_stop = True
            report_stop(self.save(step, protocol.CheckpointKind.NOTICE))
        elif self._due(step):
            self._now_seen = False
            self.save(step, protocol.CheckpointKind.PERIODIC)
        return self.should_stop

    def _due(self, step: int) -> bool:
        if step == self._last_step:
            return False
        if self._now_seen:
            return True
        return policy.due(step, self._last_step, time.monotonic() - self._last_at, every_steps=self.config.every_steps,
                          interval_s=self._interval_s)

    def save(self, step: int, kind: str = protocol.CheckpointKind.PERIODIC) -> SaveOutcome:
        """Accelerate's save_state, committed as step-N; the outcome says whether it was
        and, when not, why (writing it failed, or a notice save missed its deadline)."""
        if step == self._committed_step:  # a final save right after the periodic one of the same step
            uri = self.storage.url_for(layout.step_dir(step))
            return self._said(SaveOutcome(step, kind, True, uri, "already committed"))
        pace = persist.Pace(deadline=notice_deadline(self.config) if kind == protocol.CheckpointKind.NOTICE else None)
        if self._reference is not None:
            self._reference.prepare()  # an unusable factory stops the script here, as at the Checkpointer's first save
        started = time.monotonic()
        self._last_step, self._last_at = step, started
        staging = tempfile.mkdtemp(prefix="respawn-accelerate-save-")
        try:
            self.accelerator.save_state(staging)
            outcome = self._persist(staging, step, kind, pace, started)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return self._said(outcome)

    def finish(self, step: int):
        """End of training: the final save, committed before this returns (CheckpointError
        when it is not); with validation, the final checkpoint validated and its weights
        exported as `Checkpointer.finish` does. Returns the exported Artifact, else None."""
        outcome = self.save(step, protocol.CheckpointKind.FINAL)
        if not outcome.committed:
            raise CheckpointError(f"final checkpoint of step {step} was not committed: {outcome.message}")
        if self.config.validation is None:
            return None
        return export_final(load_checkpoint(CheckpointRef(self.storage, layout.step_dir(step))), self.config)

    def _meta(self, step: int, kind: str) -> dict:
        """state.json's body, with the reference loss of this step boundary's weights."""
        meta = {"format": layout.FORMAT, "framework": FRAMEWORK, "step": step, "kind": kind, "world_size": 1,
                "created_at": datetime.now(timezone.utc).isoformat()}
        if self._reference is not None:
            meta["validation"] = self.config.validation.to_json()
            self._reference.record(meta, self._model_weights)
        return meta

    def _model_weights(self) -> dict[str, torch.Tensor]:
        """The weights save_state wrote as its first model's file, on the host (where the
        validator's reference is computed, as for the Checkpointer's host snapshot)."""
        model = self.accelerator._models[0]  # save_state's own list: its first is model.safetensors
        return {name: t.cpu() for name, t in self.accelerator.get_state_dict(model, unwrap=False).items()}

    def _persist(self, staging: str, step: int, kind: str, pace: persist.Pace, started: float) -> SaveOutcome:
        """The staged files written to step-N and committed, within `pace.deadline`."""
        ckpt = layout.step_dir(step)
        outcome = SaveOutcome(step, kind, False, self.storage.url_for(ckpt))
        # A directory of this step is an earlier attempt's (killed, or resumed past): it goes,
        # manifest first, so that a crash meanwhile leaves it torn, never committed.
        self.storage.delete_prefix(f"{ckpt}/{layout.MANIFEST}")
        self.storage.delete_prefix(ckpt)
        try:
            took = time.monotonic() - started
            _before_deadline(pace, f"save_state took {took:.1f} s and ended past the notice deadline")
            meta = self._meta(step, kind)
            names = sorted(os.path.relpath(os.path.join(folder, name), staging)
                           for folder, _, found in os.walk(staging) for name in found)
            sources = [FileSource([], _mapped(os.path.join(staging, name))) for name in names]
            written = persist.write_files(self.storage, [f"{ckpt}/{name}" for name in names], sources, pace,
                                          threading.Event())
            _before_deadline(pace, f"step {step} was written but its deadline passed before the commit")
            self._commit(ckpt, {name: written[f"{ckpt}/{name}"] for name in names}, meta, outcome, started)
        except Exception as exc:
            self.storage.delete_prefix(ckpt)
            commit.not_committed(self.storage, outcome, f"{kind} save of step {step} not committed: {type(exc).__name__}: {exc}")
        return outcome

    def _commit(self, ckpt: str, files: dict[str, manifest.FileEntry], meta: dict, outcome: SaveOutcome,
                started: float) -> None:
        # Synchronous: training waited for all of it, and a notice save would take as long.
        commit.commit(self.storage, self.config, ckpt, files, meta, outcome, started)
        outcome.stall_s = outcome.save_s
        self._committed_step = meta["step"]

    def _said(self, outcome: SaveOutcome) -> SaveOutcome:
        self.last_outcome = outcome
        print(f"respawn accelerate: {outcome.kind} save of step {outcome.step}: "
              f"{'committed ' + outcome.uri if outcome.committed else outcome.message}", file=sys.stderr, flush=True)
        return outcome


def _before_deadline(pace: persist.Pace, missed: str) -> None:
    if pace.deadline is not None and time.monotonic() > pace.deadline:
        raise persist.PersistCancelled(missed)


def _mapped(path: str) -> memoryview:
    """A staged file's bytes, mapped rather than read into memory (unmapped with the view)."""
    with open(path, "rb") as f:
        if not os.fstat(f.fileno()).st_size:
            return memoryview(b"")
        return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))


def load_checkpoint(ref: CheckpointRef) -> LoadedCheckpoint:
    """A committed Accelerate checkpoint with every file checked against its manifest: its
    state's "files" are their bytes by name (for `load_state`), its "model" the first
    model's weights (for validation). Another framework's raises IncompatibleCheckpointError."""
    man = manifest.read(ref.storage, ref.name)
    meta = read_json(ref, man, layout.STATE)
    written_by = meta.get("framework", "torch")  # checkpoints before DESIGN §11 are the torch loop's
    if written_by != FRAMEWORK:
        raise other_framework(ref.uri, written_by, FRAMEWORK)
    files = {name: manifest.read_verified(ref.storage, ref.name, name, entry)
             for name, entry in man.files.items() if name != layout.STATE}
    return LoadedCheckpoint(ref, meta, _State(ref.uri, files), man)


class _State(dict):
    """The weights are parsed from their file when first asked for (validation): a resume
    without validation hands the files to load_state as they are, and parsing them would
    cost another copy of the model in memory."""

    def __init__(self, uri: str, files: dict):
        super().__init__(files=files)
        self.uri = uri

    def __missing__(self, key: str):
        if key != "model":
            raise KeyError(key)
        files = self["files"]
        if MODEL_FILES[0] in files:
            weights = safetensors_load(bytes(files[MODEL_FILES[0]]))
        elif MODEL_FILES[1] in files:
            weights = torch.load(io.BytesIO(files[MODEL_FILES[1]]), map_location="cpu", weights_only=True)
        else:
            raise IncompatibleCheckpointError(
                f"checkpoint {self.uri} has neither of {', '.join(MODEL_FILES)}, the files save_state writes for its "
                f"first model unless FSDP or DeepSpeed saves it: its weights cannot be validated")
        self["model"] = weights
        return weights
