"""A Flax / optax training loop with Orbax checkpoints made spot-safe by respawn.integrations.jax.

A tiny MLP with dropout, built from a config (no hub), regresses a fixed random
function; the batches are a deterministic sequence indexed by a data position. The
train state holds params, optimizer state and a PRNG key. Run it under the agent, or:

    python -m respawn.examples.jax_flax --uri /tmp/ckpt --steps 60

A SIGTERM saves at the next step and exits 0; running it again resumes there exactly.
Validation (a reference loss at each save, checked by the validator): `--validate`, or
RESPAWN_MODEL_FACTORY=respawn.examples.jax_flax:make_state,
RESPAWN_BATCH_FACTORY=respawn.examples.jax_flax:validation_batch,
RESPAWN_EVAL_FN=respawn.examples.jax_flax:eval_loss.
"""

from __future__ import annotations

import os
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from respawn import protocol, trainer
from respawn.checkpoint import CheckpointConfig, ValidationSettings
from respawn.examples import framework_cli
from respawn.integrations.jax import SpotSafe

FEATURES = 8
BATCH = 16


class MLP(nn.Module):
    hidden: int
    layers: int = 1

    @nn.compact
    def __call__(self, x, train: bool = False):
        for _ in range(self.layers):
            x = nn.relu(nn.Dense(self.hidden)(x))
        x = nn.Dropout(0.1, deterministic=not train)(x)
        return nn.Dense(1)(x)


def make_state(hidden: int = 16, layers: int = 1) -> dict:
    """The train state from scratch: params, optimizer state, PRNG key (also the
    validation template: only its structure, shapes and dtypes are used there)."""
    params = MLP(hidden, layers).init(jax.random.key(0), jnp.zeros((1, FEATURES)))
    return {"params": params, "opt_state": optimizer().init(params), "key": jax.random.key(1)}


def optimizer() -> optax.GradientTransformation:
    return optax.adamw(optax.linear_schedule(3e-3, 3e-4, 200))


def batch_at(position: int) -> tuple[np.ndarray, np.ndarray]:
    """Batch number `position` of the data stream: the same for the same position."""
    rng = np.random.default_rng(position)
    x = rng.standard_normal((BATCH, FEATURES), dtype=np.float32)
    return x, np.sin(x.sum(axis=1, keepdims=True))


def validation_batch() -> tuple[np.ndarray, np.ndarray]:
    return batch_at(10**6)


def eval_loss(state: dict, batch) -> float:
    x, y = batch
    hidden = state["params"]["params"]["Dense_0"]["kernel"].shape[1]
    return float(jnp.mean((MLP(hidden).apply(state["params"], x) - y) ** 2))


def make_train_step(hidden: int, layers: int = 1):
    model, tx = MLP(hidden, layers), optimizer()

    @jax.jit
    def train_step(state, x, y):
        key, dropout = jax.random.split(state["key"])

        def loss_fn(params):
            return jnp.mean((model.apply(params, x, train=True, rngs={"dropout": dropout}) - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state, "key": key}, loss

    return train_step


def main(argv: list[str] | None = None) -> int:
    parser = framework_cli.parser(__doc__.splitlines()[0])
    parser.set_defaults(steps=int(os.environ.get(protocol.ENV_TOTAL_STEPS, "60")))
    parser.add_argument("--validate", action="store_true", help="name this module's validation factories")
    args = parser.parse_args(argv)
    here = "respawn.examples.jax_flax"  # not __name__: it is __main__ under `python -m`
    overrides = {"validation": ValidationSettings(f"{here}:make_state", f"{here}:validation_batch",
                                                  eval_fn=f"{here}:eval_loss")} if args.validate else {}
    ckpt = SpotSafe(CheckpointConfig.from_env(uri=args.uri, every_steps=args.every_steps, **overrides))
    restored = ckpt.restore(make_state(args.n_embd))
    state, position = restored.state, restored.extra.get("position", 0)
    train_step = make_train_step(args.n_embd)
    for step in range(restored.step, args.steps):
        state, loss = train_step(state, *batch_at(position))
        position += 1
        trainer.report(step + 1, float(loss))
        ckpt.save(step + 1, state, extra={"position": position})
        if ckpt.should_stop:
            ckpt.stop(step + 1)
        if args.step_delay:
            time.sleep(args.step_delay)
    if restored.step < args.steps:
        trainer.report(args.steps, float(loss), force=True)
    ckpt.finish(args.steps, state, extra={"position": position})
    print(f"finished {args.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
