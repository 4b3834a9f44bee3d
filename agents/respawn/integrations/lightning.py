"""PyTorch Lightning, spot-safe with one line added to the script:

    trainer = L.Trainer(max_steps=..., ...)
    spot_safe(trainer)              # from respawn.integrations.lightning import spot_safe
    trainer.fit(model, train_loader)

- Saves go through Respawn's Checkpointer at optimizer step boundaries
  (`on_train_batch_end` after a batch that stepped the optimizer, where Lightning's own
  ModelCheckpoint saves): two-phase periodic saves beside training, committed under
  DESIGN §6 (MANIFEST last, LATEST, rotation, reports to the agent). What is saved is
  Lightning's own checkpoint content (`dump_checkpoint`: loops, callbacks, schedulers,
  precision state) with the module's weights and the optimizer's state as Respawn's
  tensors, plus the RNG states, which Lightning's checkpoints leave out.
- Signals: our SIGTERM handler is installed at `on_fit_start`, before Lightning's
  signal connector registers its own, which keeps ours and calls it too. Both see the
  notice: ours saves at the next step boundary, then Lightning ends the run as it
  always does on SIGTERM (SIGTERMException, exit 0), and the status file says
  `stopped`. Nothing is replaced or suppressed on Lightning's side.
- `trainer.fit(...)` without `ckpt_path` resumes from the newest committed, validated
  checkpoint, written out as a Lightning .ckpt for Lightning's own restore; the RNG
  states are put back just before the first resumed batch.
- Each optimizer step's loss (`training_step`'s, summed over accumulated batches as
  Lightning scales them) goes to the agent's status and metrics files.
- Exact mid-epoch resume needs a train loader with a state (Lightning saves and
  restores it): `respawn.checkpoint.ResumableLoader`. A plain DataLoader restarts the
  epoch's order on resume, as it does with Lightning's own checkpoints.

One process, one optimizer.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from respawn import trainer as status
from respawn.checkpoint.checkpointer import Checkpointer, CheckpointConfig
from respawn.checkpoint.errors import ConfigError
from respawn.checkpoint.reader import LoadedCheckpoint
from respawn.checkpoint.state import TrainState, set_rng_state

from ._common import choose_checkpoint, report_stop, require_supported

require_supported("lightning")  # before its imports, which another release may fail less clearly

from lightning.pytorch import Callback  # noqa: E402
from lightning.pytorch.utilities.exceptions import SIGTERMException  # noqa: E402

FRAMEWORK = "lightning"
# Lightning's checkpoint keys that Respawn stores as tensors of its own (the TrainState's
# model and optimizer), and those only `load_from_checkpoint` reads (arbitrary objects).
_AS_TENSORS = ("state_dict", "optimizer_states")
_NOT_FOR_FIT = ("hyper_parameters", "hparams_name", "hparams_type", "datamodule_hyper_parameters",
                "datamodule_hparams_name", "datamodule_hparams_type")


def spot_safe(trainer, config: CheckpointConfig | None = None, *, exit_on_stop: bool = True) -> "SpotSafe":
    """Make `trainer` spot-safe (see the module's text); returns the callback it added."""
    if trainer.world_size > 1:
        raise ConfigError(f"respawn.integrations.lightning runs one process; this Trainer has world_size={trainer.world_size}")
    callback = SpotSafe(config or CheckpointConfig.from_env())
    trainer.callbacks.append(callback)
    original = trainer.fit

    @functools.wraps(original)
    def fit(model, train_dataloaders=None, val_dataloaders=None, datamodule=None, ckpt_path=None, **kwargs):
        staged = None
        if ckpt_path is None:  # a checkpoint the script names itself wins
            staged = callback.stage_resume()
            ckpt_path = staged and os.path.join(staged, "resume.ckpt")
        try:
            original(model, train_dataloaders, val_dataloaders, datamodule, ckpt_path, **kwargs)
        finally:
            if staged is not None:
                shutil.rmtree(staged, ignore_errors=True)
        if callback.stopped and exit_on_stop:
            sys.exit(0)

    trainer.fit = fit
    return callback


@dataclass
class _LightningState(TrainState):
    """The TrainState plus Lightning's own checkpoint content, taken at snapshot time."""

    trainer: object = None

    def state_dict(self) -> dict:
        dump = self.trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        self.extra["lightning"] = {k: v for k, v in dump.items() if k not in (*_AS_TENSORS, *_NOT_FOR_FIT)}
        return super().state_dict()


class SpotSafe(Callback):
    def __init__(self, config: CheckpointConfig):
        self.config = config
        self.ckpt: Checkpointer | None = None
        self.resumed_step = 0
        self.stopped = False
        self._rng: dict | None = None
        self._seen_step = -1
        self._at_boundary = True  # the last batch ended with an optimizer step (or none ran yet)
        self._step_loss = None  # the current optimizer step's loss, summed over its batches

    def stage_resume(self) -> str | None:
        """The newest usable checkpoint as a Lightning .ckpt in a temporary folder."""
        loaded = choose_checkpoint(self.config, FRAMEWORK)
        if loaded is None:
            return None
        folder = tempfile.mkdtemp(prefix=f"respawn-lightning-{loaded.ref.step}-")
        torch.save(lightning_checkpoint(loaded), os.path.join(folder, "resume.ckpt"))
        self.resumed_step, self._rng = loaded.ref.step, loaded.state["rng"]
        return folder

    def on_fit_start(self, trainer, pl_module):
        # Before Lightning's signal connector: it keeps our SIGTERM handler and calls it too.
        if len(trainer.optimizers) != 1:
            raise ConfigError(f"respawn.integrations.lightning saves one optimizer; this module has {len(trainer.optimizers)}")
        state = _LightningState(pl_module, trainer.optimizers[0], trainer=trainer)
        # Lightning runs forward/backward inside optimizer.step(closure): an optimizer step
        # pre-hook would make them wait for the snapshot; on_before_optimizer_step comes after.
        self.ckpt = Checkpointer(state, self.config, framework=FRAMEWORK, hook_optimizer=False)
        if self.resumed_step:
            self.ckpt.resumed_at(self.resumed_step)
            self._seen_step = self.resumed_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._rng is not None:  # the resumed run's first batch: the RNG as the saved step left it
            set_rng_state(self._rng)
            self._rng = None

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.ckpt.before_optimizer_step()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # Automatic optimization hands {"loss": ...} divided by accumulate_grad_batches;
        # manual optimization, whatever training_step returned.
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor):
            self._step_loss = loss.detach() if self._step_loss is None else self._step_loss + loss.detach()
        self._at_boundary = trainer.global_step != self._seen_step
        if not self._at_boundary:
            return  # mid gradient accumulation: not a step boundary
        self._seen_step = trainer.global_step
        if self._step_loss is not None:
            status.report(trainer.global_step, float(self._step_loss))
            self._step_loss = None
        self.ckpt.save(trainer.global_step)
        if self.ckpt.should_stop and not self.stopped:
            self.stopped = True
            trainer.should_stop = True  # without Lightning's SIGTERM (a stop by other means) too
            report_stop(self.ckpt.last_outcome)

    def on_exception(self, trainer, pl_module, exception):
        if self.ckpt is None:
            return
        if isinstance(exception, SIGTERMException) and not self.stopped:
            # The signal came after this step's on_train_batch_end: the state is still the
            # step boundary's (when the optimizer stepped), so the notice save is made here.
            self.stopped = True
            outcome = None
            if self._at_boundary:
                self.ckpt.save(trainer.global_step)
                outcome = self.ckpt.last_outcome
            else:
                print("respawn lightning: the notice came mid gradient accumulation; the previous checkpoint stands",
                      file=sys.stderr, flush=True)
            self.ckpt.close()
            report_stop(outcome)
            return
        self.ckpt.close()

    def on_train_end(self, trainer, pl_module):
        if self.stopped:
            self.ckpt.close()
        else:
            self.ckpt.finish(trainer.global_step)


def lightning_checkpoint(loaded: LoadedCheckpoint) -> dict:
    """The checkpoint dict Lightning's `save_checkpoint` would have written at that step."""
    state = loaded.state
    # Loaded tensors are views into shared read buffers: each gets its own storage.
    own = functools.partial(_map_tensors, lambda t: t.clone())
    return own(state["extra"]["lightning"]) | {"state_dict": own(state["model"]), "optimizer_states": [own(state["optimizer"])]}


def _map_tensors(fn, obj):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(fn, v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(fn, v) for v in obj)
    return obj
