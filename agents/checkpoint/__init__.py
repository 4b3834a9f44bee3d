"""Spot-safe checkpointing for PyTorch training loops (DESIGN §6).

Public API (everything else in this package is internal):

    from agents.checkpoint import Checkpointer, CheckpointConfig, TrainState, ResumableSampler

    sampler = ResumableSampler(len(dataset), batch_size=32, seed=0)
    state = TrainState(model, optimizer, scheduler, scaler=None, sampler=sampler)
    ckpt = Checkpointer(state, CheckpointConfig.from_env(uri="/data/ckpt", every_steps=100))
    start = ckpt.load_latest()            # newest valid checkpoint restored; 0 if none
    for step in range(start, total):
        batch = [dataset[i] for i in sampler.next_batch()]
        ...forward, backward, optimizer.step()...
        ckpt.save(step + 1)               # every step: saves when due (every N steps / T seconds)
        if ckpt.should_stop:              # SIGTERM or request_stop(): a notice save was made
            break
    else:
        artifact = ckpt.finish(total)     # final save, validation, safetensors export
    ckpt.close()

- `Checkpointer.save(step, kind=None|"periodic"|"notice"|"final", deadline=None)`,
  `load_latest()`, `wait()`, `close()`, `finish(step)`, `set_interval(seconds)`,
  `request_stop()`, `request_checkpoint()`, `should_stop`, `last_outcome`.
- Signals: SIGTERM -> notice save at the next `save()` then `should_stop`;
  SIGUSR1 -> a save at the next `save()`. Handlers only set flags.
- Agent channel (all optional, see agents/protocol.py): RESPAWN_CHECKPOINT_URI,
  RESPAWN_CHECKPOINT_INTERVAL_S, RESPAWN_RESUME_FROM, RESPAWN_CONTROL_FILE (polled
  for `checkpoint_interval_s`), RESPAWN_NOTICE_FILE (`deadline`), RESPAWN_CHECKPOINTS_FILE
  (one CheckpointReport JSON line per commit), RESPAWN_MODEL_FACTORY /
  RESPAWN_BATCH_FACTORY (validation), RESPAWN_PG_TIMEOUT_S (gangs).
- `validate(uri)` -> Verdict; `python -m agents.checkpoint.validate <uri>` prints it as JSON.
- `export_weights(ref)` writes model.safetensors from a checkpoint recorded valid.
- `init_process_group(timeout_s=...)`: gloo/nccl with a short timeout; under
  torch.distributed each rank writes its own data files, rank 0 commits.
- Format: DESIGN §6, one step-NNNNNNNN/ directory per checkpoint (agents/checkpoint/layout.py).
  Tensors are packed into a few raw data files per rank (not torch.distributed.checkpoint):
  that is what lets snapshots reuse one set of (pinned) host buffers, persists be paced
  chunk by chunk, and digests be computed while writing, which DCP's async_save does not offer.
- Errors: CheckpointError and its subclasses CorruptCheckpointError,
  IncompatibleCheckpointError, ExportRefusedError, FactoryError; ConfigError for
  bad settings; storage.UnknownSchemeError for an unknown URI scheme.
"""

from .checkpointer import CheckpointConfig, Checkpointer, SaveOutcome
from .distributed import init_process_group
from .errors import (
    CheckpointError,
    ConfigError,
    CorruptCheckpointError,
    ExportRefusedError,
    FactoryError,
    IncompatibleCheckpointError,
)
from .export import Artifact, export_weights
from .reader import CheckpointRef, ref_from_uri
from .sampler import ResumableSampler
from .state import TrainState
from .validation import ValidationSettings, Verdict
from .validation import validate as _validate_ref


def validate(uri: str, settings: ValidationSettings | None = None, record: bool = True) -> Verdict:
    """Validate the checkpoint at `uri` (`<root>/step-NNNNNNNN`) with the factories it
    was saved with (or `settings`), recording the verdict beside it."""
    return _validate_ref(ref_from_uri(uri), settings, record)


__all__ = [
    "Artifact", "CheckpointConfig", "CheckpointError", "CheckpointRef", "Checkpointer", "ConfigError",
    "CorruptCheckpointError", "ExportRefusedError", "FactoryError", "IncompatibleCheckpointError",
    "ResumableSampler", "SaveOutcome", "TrainState", "ValidationSettings", "Verdict", "export_weights",
    "init_process_group", "ref_from_uri", "validate",
]
