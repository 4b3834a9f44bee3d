"""Spot-safe checkpointing for PyTorch training loops (DESIGN §6).

Public API (everything else in this package is internal):

    from respawn.checkpoint import Checkpointer, CheckpointConfig, TrainState, ResumableSampler

    sampler = ResumableSampler(len(dataset), batch_size=32, seed=0)
    state = TrainState(model, optimizer, scheduler, scaler=None, sampler=sampler)
    ckpt = Checkpointer(state, CheckpointConfig.from_env(uri="/data/ckpt", every_steps=100))
    resumed = ckpt.load_latest()          # newest valid checkpoint restored (step 0 if none)
    print(resumed)                        # which one, and why newer ones were skipped
    for step in range(resumed.step, total):
        batch = [dataset[i] for i in sampler.next_batch()]
        ...forward, backward, optimizer.step()...
        ckpt.save(step + 1)               # every step: saves when due (every N steps / T seconds)
        if ckpt.should_stop:              # SIGTERM or request_stop(): a notice save was made
            break
    else:
        artifact = ckpt.finish(total)     # final save, validation, safetensors export
    ckpt.close()

- Data with worker processes: `loader = ResumableLoader(dataset, batch_size, seed=0,
  shuffle=True, num_workers=4)` (torchdata's StatefulDataLoader, imported on first use)
  and `TrainState(model, optimizer, loader=loader)`; `for batch in loader` per epoch.
- `Checkpointer.save(step, kind=None|"periodic"|"notice"|"final", deadline=None)`,
  `load_latest()` -> Resumed(step, uri, skipped=(Skipped(step, uri, reason), ...)),
  `wait()`, `close()`, `finish(step)`, `set_interval(seconds)`, `request_stop()`,
  `request_checkpoint()`, `should_stop`, `last_outcome`.
- Saves every RESPAWN_CHECKPOINT_INTERVAL_S seconds (600 when unset; the agent sets
  the job's interval), or every `interval_s` / `every_steps` given to CheckpointConfig.
- Disk: the `keep` newest committed checkpoints stay (plus the newest valid one, and the
  one a validator is reading); directories of saves cut short by a kill go on the next
  start or commit.
- Signals: SIGTERM -> notice save at the next `save()` then `should_stop`;
  SIGUSR1 -> a save at the next `save()`. Handlers only set flags.
- Agent channel (all optional, see agents/respawn/protocol.py): RESPAWN_CHECKPOINT_URI,
  RESPAWN_CHECKPOINT_INTERVAL_S, RESPAWN_RESUME_FROM, RESPAWN_CONTROL_FILE (polled
  for `checkpoint_interval_s`), RESPAWN_NOTICE_FILE (`deadline`), RESPAWN_CHECKPOINTS_FILE
  (one CheckpointReport JSON line per commit), RESPAWN_MODEL_FACTORY /
  RESPAWN_BATCH_FACTORY / RESPAWN_EVAL_FN (validation), RESPAWN_PG_TIMEOUT_S (gangs).
- Validation: `ValidationSettings(model_factory, batch_factory, tolerance, eval_fn="")`,
  each `module:function`; `eval_fn(model, batch) -> float` is the user's loss, else
  `default_loss` (agents/respawn/checkpoint/validation.py: classifiers, regression, causal LMs,
  dict / ModelOutput outputs, dict batches as **kwargs). Verdicts: valid, invalid, error.
- `validate(uri)` -> Verdict; `python -m respawn.checkpoint.validate <uri>` prints it as JSON.
- `export_weights(ref)` writes model.safetensors from a checkpoint recorded valid.
- `init_process_group(timeout_s=...)`: gloo/nccl with a short timeout; under
  torch.distributed each rank writes its own data files, rank 0 commits. Ranks agree
  on a gloo group of the checkpointer's own (the job's may be NCCL-only), without
  blocking a step; a stop seen by one rank stops all at the same step, within
  2 x `agree_every_steps` - 1 steps (docs/coordination.md).
  `leave_process_group()` at the end: all ranks tear the group down together.
- Frameworks: agents/respawn/integrations (HF Trainer, Lightning, Accelerate) build on this
  package. `Checkpointer(state, config, framework="torch")` names the writer in
  state.json and `load_latest()` refuses another framework's checkpoint
  (IncompatibleCheckpointError, nothing deleted); `resumed_at(step)` when a framework's
  own resume restored a checkpoint; `hook_optimizer=False` + `before_optimizer_step()`
  when forward/backward run inside `optimizer.step(closure)`.
- Format: DESIGN §6, one step-NNNNNNNN/ directory per checkpoint (agents/respawn/checkpoint/layout.py).
  Tensors are packed into a few raw data files per rank (not torch.distributed.checkpoint):
  that is what lets snapshots reuse one set of (pinned) host buffers, persists be paced
  chunk by chunk, and digests be computed while writing, which DCP's async_save does not offer.
- Errors: CheckpointError and its subclasses CorruptCheckpointError,
  IncompatibleCheckpointError, ExportRefusedError, FactoryError, EvalError; ConfigError for
  bad settings; storage.UnknownSchemeError for an unknown URI scheme.
"""

import importlib

# Names load on first use (PEP 562): the agent uses this package's storage and manifest
# modules without torch, whose import alone costs ~1.7 s of CPU on every VM.
_EXPORTS = {
    ".checkpointer": ("CheckpointConfig", "Checkpointer", "SaveOutcome"),
    ".distributed": ("init_process_group", "leave_process_group"),
    ".errors": ("CheckpointError", "ConfigError", "CorruptCheckpointError", "EvalError", "ExportRefusedError",
                "FactoryError", "IncompatibleCheckpointError"),
    ".export": ("Artifact", "export_weights"),
    ".loader": ("ResumableLoader",),
    ".reader": ("CheckpointRef", "ref_from_uri"),
    ".resume": ("Resumed", "Skipped"),
    ".sampler": ("ResumableSampler",),
    ".sharded": ("ShardedCheckpointer", "ShardedState"),
    ".state": ("TrainState",),
    ".validation": ("ValidationSettings", "Verdict"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULE_OF[name], __name__), name)
    globals()[name] = value
    return value


def validate(uri: str, settings=None, record: bool = True):
    """Validate the checkpoint at `uri` (`<root>/step-NNNNNNNN`) with the factories it
    was saved with (or `settings`, a ValidationSettings), recording the verdict beside
    it; returns the Verdict."""
    from .reader import ref_from_uri
    from .validation import validate as validate_ref

    return validate_ref(ref_from_uri(uri), settings, record)


__all__ = sorted([*_MODULE_OF, "validate"])
