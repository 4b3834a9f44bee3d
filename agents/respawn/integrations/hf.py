"""Hugging Face Trainer, spot-safe with one line added to the script:

    trainer = Trainer(model=model, args=args, train_dataset=train, ...)
    spot_safe(trainer)              # from respawn.integrations.hf import spot_safe
    trainer.train()

- A notice (SIGTERM from the agent, or the agent's stop) is seen at the next optimizer
  step boundary (`on_step_end`: weights, optimizer, scheduler and global_step all
  updated, the next batch not drawn): the state is saved there, inside the notice's
  deadline, then training stops and the process exits 0 with `stopped` in the status
  file, so neither the agent nor the rest of the script takes it for a finished run.
- Periodic saves are Respawn's two-phase ones (Checkpointer): a host snapshot, then a
  paced background write, committed under DESIGN §6 (MANIFEST last, LATEST, rotation,
  a report to the agent). Trainer's own `save_strategy` is left as the script set it.
- `trainer.train()` without `resume_from_checkpoint` resumes from the newest committed,
  validated checkpoint: it is verified, written out as a Trainer checkpoint directory
  (model.safetensors, optimizer.pt, scheduler.pt, rng_state.pth, trainer_state.json) in
  a temporary folder, and handed to Trainer's own resume, which skips the batches
  already trained and restores the RNG as it does for its own checkpoints (and, with
  persistent loader workers, starts them without the draw an unbroken run did not make). A torn
  directory (a save killed midway) has no manifest and is never picked.
- Each optimizer step's loss (what `training_step` returned, summed over its
  micro-batches) goes to the agent's status and metrics files, so a resumed run reports
  the same losses as an uninterrupted one (Trainer's logged loss is averaged since its
  last log).

Single process only (`args.world_size == 1`); DeepSpeed and FSDP are refused.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
import functools
import json
import os
import shutil
import sys
import tempfile

import torch

from respawn import trainer as status
from respawn.checkpoint.checkpointer import Checkpointer, CheckpointConfig
from respawn.checkpoint.errors import ConfigError
from respawn.checkpoint.reader import LoadedCheckpoint
from respawn.checkpoint.state import TrainState

from ._common import choose_checkpoint, report_stop, require_supported

require_supported("transformers")  # before its imports, which another release may fail less clearly

from transformers import TrainerCallback  # noqa: E402
from transformers.trainer_callback import ExportableState  # noqa: E402

FRAMEWORK = "hf"


def spot_safe(trainer, config: CheckpointConfig | None = None, *, exit_on_stop: bool = True) -> "RespawnCallback":
    """Make `trainer` spot-safe (see the module's text); returns the callback it added.
    `config` defaults to `CheckpointConfig.from_env()` (the agent's settings); with
    `exit_on_stop=False`, `train()` returns after a notice stop and the callback's
    `stopped` says so."""
    if trainer.args.world_size > 1:
        raise ConfigError(f"respawn.integrations.hf runs one process; this Trainer has world_size={trainer.args.world_size}")
    if trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled:
        raise ConfigError("respawn.integrations.hf does not save DeepSpeed or FSDP state; use Trainer's own checkpoints")
    callback = RespawnCallback(trainer, config or CheckpointConfig.from_env())
    trainer.add_callback(callback)
    original = trainer.train

    @functools.wraps(original)
    def train(resume_from_checkpoint=None, *args, **kwargs):
        # A checkpoint the script names itself wins; `True` would pick Trainer's own newest
        # checkpoint-N, torn or not, so it means "Respawn's newest" here.
        staged = None
        if resume_from_checkpoint in (None, True):
            staged = resume_from_checkpoint = callback.stage_resume()
        try:
            output = original(resume_from_checkpoint, *args, **kwargs)
        finally:
            if staged is not None:
                shutil.rmtree(staged, ignore_errors=True)
        if callback.stopped and exit_on_stop:
            sys.exit(0)
        return output

    trainer.train = train
    original_step = trainer.training_step

    @functools.wraps(original_step)
    def training_step(*args, **kwargs):
        loss = original_step(*args, **kwargs)
        callback.add_loss(loss)
        return loss

    trainer.training_step = training_step
    return callback


class RespawnCallback(TrainerCallback):
    """Saves through a Checkpointer at each step boundary where one is due or a notice came."""

    def __init__(self, trainer, config: CheckpointConfig):
        self.trainer = trainer
        self.config = config
        self.ckpt: Checkpointer | None = None
        self.resumed_step = 0
        self.stopped = False
        self._step_loss = None  # the current optimizer step's loss, summed over its micro-batches

    def add_loss(self, loss) -> None:
        """One micro-batch's loss as `training_step` returns it (already divided by the
        gradient accumulation steps, so the sum over a step is the step's loss)."""
        self._step_loss = loss if self._step_loss is None else self._step_loss + loss

    def stage_resume(self) -> str | None:
        """The newest usable checkpoint, written out as a Trainer checkpoint directory
        for Trainer's own resume; None when there is none."""
        loaded = choose_checkpoint(self.config, FRAMEWORK)
        if loaded is None:
            return None
        folder = tempfile.mkdtemp(prefix=f"respawn-hf-{loaded.ref.step}-")
        write_trainer_checkpoint(loaded, folder)
        self.resumed_step = loaded.ref.step
        return folder

    def on_train_begin(self, args, state, control, **kwargs):
        trainer = self.trainer
        scaler = getattr(trainer.accelerator, "scaler", None)
        # Accelerate wraps both; the state (and the optimizer's step hook) is the inner one's.
        optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
        scheduler = getattr(trainer.lr_scheduler, "scheduler", trainer.lr_scheduler)
        train_state = _TrainerState(trainer.model, optimizer, scheduler, scaler=scaler, trainer=trainer)
        self.ckpt = Checkpointer(train_state, self.config, framework=FRAMEWORK)
        if self.resumed_step:
            self.ckpt.resumed_at(self.resumed_step)
            _start_persistent_workers_as_before(kwargs.get("train_dataloader"))

    def on_step_end(self, args, state, control, **kwargs):
        # The step's own loss, not Trainer's logged one: that is averaged since the last
        # log, a window that a resume shortens, so the same step would report another loss.
        if self._step_loss is not None:
            status.report(state.global_step, float(self._step_loss))
            self._step_loss = None
        self.ckpt.save(state.global_step)
        if self.ckpt.should_stop and not self.stopped:
            self.stopped = True
            control.should_training_stop = True
            report_stop(self.ckpt.last_outcome)

    def on_train_end(self, args, state, control, **kwargs):
        if self.stopped:
            self.ckpt.close()
        else:
            self.ckpt.finish(state.global_step)  # final save, validation, export when configured


def _start_persistent_workers_as_before(loader) -> None:
    """A DataLoader draws its workers' base seed from the global RNG when it makes its
    iterator: every epoch without persistent workers, once with them. An unbroken run
    drew that once, before the step its checkpoint restores the RNG of; a resumed run
    would draw it again at its first whole epoch (Trainer's skipping loader is another
    loader, whose draw Trainer's own RNG restore undoes), and from there on every random
    number (dropout's) would differ. The persistent iterator is made here, its draw
    undone, so each epoch's iter() resets it as in the unbroken run. Random numbers the
    workers themselves draw are theirs and are not restored either way."""
    # Accelerate's DataLoaderShard wraps the DataLoader that makes the iterator; its own
    # __iter__ is a generator, which would make nothing until its first batch.
    loader = getattr(loader, "base_dataloader", loader)
    if not getattr(loader, "persistent_workers", False) or getattr(loader, "_iterator", None) is not None:
        return
    with torch.random.fork_rng(devices=[]):
        iter(loader)


@dataclass
class _TrainerState(TrainState):
    """The TrainState plus what Trainer's own save writes to trainer_state.json, taken
    when a save snapshots the state (at a step boundary), not at every step."""

    trainer: object = None

    def state_dict(self) -> dict:
        trainer = self.trainer
        self.extra["trainer_state"] = trainer_state_json(trainer.state, [*trainer.callback_handler.callbacks, trainer.control])
        return super().state_dict()


def trainer_state_json(state, callbacks) -> str:
    """trainer_state.json as Trainer's `_save_checkpoint` writes it (its exportable
    callbacks' states included), without changing the live TrainerState."""
    exported: dict = {}
    for cb in callbacks:
        if isinstance(cb, ExportableState):
            name = type(cb).__name__
            exported[name] = [*exported[name], cb.state()] if isinstance(exported.get(name), list) else (
                [exported[name], cb.state()] if name in exported else cb.state())
    body = dataclasses.asdict(state) | {"stateful_callbacks": exported}
    return json.dumps(body, indent=2, sort_keys=True) + "\n"


def write_trainer_checkpoint(loaded: LoadedCheckpoint, folder: str) -> None:
    """The files Trainer's `_save_checkpoint` would have written at that step."""
    from safetensors.torch import save_file

    state = loaded.state
    # Loaded tensors are views into shared read buffers; safetensors wants each its own.
    save_file({k: v.clone() for k, v in state["model"].items()}, os.path.join(folder, "model.safetensors"),
              metadata={"format": "pt"})
    torch.save(state["optimizer"], os.path.join(folder, "optimizer.pt"))
    torch.save(state["scheduler"], os.path.join(folder, "scheduler.pt"))
    if "scaler" in state:
        torch.save(state["scaler"], os.path.join(folder, "scaler.pt"))
    rng = state["rng"]
    hf_rng = {"python": rng["python"], "numpy": rng["numpy"], "cpu": rng["torch"].clone()}
    if "cuda" in rng:
        hf_rng["cuda"] = rng["cuda"][0].clone()
    torch.save(hf_rng, os.path.join(folder, "rng_state.pth"))
    with open(os.path.join(folder, "trainer_state.json"), "w") as f:
        f.write(state["extra"]["trainer_state"])
