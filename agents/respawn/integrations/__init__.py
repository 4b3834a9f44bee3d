"""Respawn for training code as it is: one line makes a framework's script spot-safe.

- `respawn.integrations.hf.spot_safe(trainer)`: Hugging Face Trainer.
- `respawn.integrations.lightning.SpotSafe()`: a Lightning callback, and `spot_safe_fit`.
- `respawn.integrations.accelerate.SpotSafeState(accelerator)`: Accelerate's
  `save_state` / `load_state` users (`resume`, `step` each step, `finish`).
- `respawn.integrations.jax.SpotSafe(config)`: a JAX / Flax / optax loop saving through
  Orbax (`restore`, `save` each step, `stop`, `finish`).

Each keeps the framework's own resume code (so what it restores exactly stays exact)
and puts Respawn's checkpointing under it (DESIGN §6: saves beside training where the
framework's save allows it, which Accelerate's synchronous save_state does not; the
notice save at the next step boundary, committed by the notice's deadline or not at all;
MANIFEST written last, LATEST, rotation, reports to the agent, validation). A
checkpoint's state.json names the framework that wrote it (DESIGN §11); each integration
refuses another's with IncompatibleCheckpointError.

The frameworks are imported by these modules only, never by the agent or by
`respawn.checkpoint` (extras `respawn-ml[hf]`, `respawn-ml[lightning]`, `respawn-ml[jax]`); the
validator process (`python -m respawn.checkpoint.validate`) imports respawn.integrations.jax
for a JAX checkpoint only, and respawn.integrations.accelerate (which imports no
Accelerate) for an Accelerate one.
"""
