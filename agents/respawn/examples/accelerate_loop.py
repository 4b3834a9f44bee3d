"""An Accelerate training loop with Respawn's SpotSafeState around save_state/load_state.

    python -m respawn.examples.accelerate_loop --uri /tmp/ckpt --steps 60

A SIGTERM saves at the next step and exits 0; running it again resumes there.
Validation (a reference loss at each save, checked by the validator): `--validate`, or
RESPAWN_MODEL_FACTORY=respawn.examples.tiny_lm:make_model,
RESPAWN_BATCH_FACTORY=respawn.examples.tiny_lm:validation_batch (the default width only:
the factory builds tiny_lm's default model).
"""

from __future__ import annotations

import sys
import time

import torch
from accelerate import Accelerator

from respawn import trainer
from respawn.checkpoint import CheckpointConfig, ValidationSettings
from respawn.examples import framework_cli, tiny_lm
from respawn.integrations.accelerate import SpotSafeState

VALIDATION = ValidationSettings("respawn.examples.tiny_lm:make_model", "respawn.examples.tiny_lm:validation_batch")


def main(argv: list[str] | None = None) -> int:
    parser = framework_cli.parser(__doc__.splitlines()[0])
    parser.add_argument("--validate", action="store_true", help="name tiny_lm's validation factories")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # bitwise reproducibility does not survive a change of thread count
    accelerator = Accelerator(cpu=True, rng_types=["torch", "generator"])
    torch.manual_seed(0)
    model = tiny_lm.TinyGPT(tiny_lm.Config(n_embd=args.n_embd))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.9)
    loader = torch.utils.data.DataLoader(tiny_lm.tokens(2048, seed=1), batch_size=8, shuffle=True,
                                         generator=torch.Generator().manual_seed(0), num_workers=args.workers,
                                         persistent_workers=args.persistent_workers and args.workers > 0)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    overrides = {"validation": VALIDATION} if args.validate else {}
    config = CheckpointConfig.from_env(uri=args.uri, every_steps=args.every_steps, **overrides)
    spot = SpotSafeState(accelerator, config)
    start = spot.resume()
    for step, batch in enumerate(accelerator.skip_first_batches(loader, start), start):
        if step >= args.steps:
            break
        loss = tiny_lm.shifted_cross_entropy(model(batch), batch)
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        trainer.report(step + 1, loss.item())
        if args.step_delay:
            time.sleep(args.step_delay)
        if spot.step(step + 1):
            return 0
    spot.finish(args.steps)
    print(f"finished {args.steps} steps", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
