"""An Accelerate training loop with Respawn's SpotSafeState around save_state/load_state.

    python -m agents.examples.accelerate_loop --uri /tmp/ckpt --steps 60

A SIGTERM saves at the next step and exits 0; running it again resumes there.
"""

from __future__ import annotations

import sys
import time

import torch
from accelerate import Accelerator

from agents.checkpoint import CheckpointConfig
from agents.examples import framework_cli, tiny_lm
from agents.integrations.accelerate import SpotSafeState


def main(argv: list[str] | None = None) -> int:
    args = framework_cli.parser(__doc__.splitlines()[0]).parse_args(argv)
    torch.set_num_threads(1)  # bitwise reproducibility does not survive a change of thread count
    accelerator = Accelerator(cpu=True, rng_types=["torch", "generator"])
    torch.manual_seed(0)
    model = tiny_lm.TinyGPT(tiny_lm.Config(n_embd=args.n_embd))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.9)
    loader = torch.utils.data.DataLoader(tiny_lm.tokens(2048, seed=1), batch_size=8, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    spot = SpotSafeState(accelerator, CheckpointConfig.from_env(uri=args.uri, every_steps=args.every_steps))
    start = spot.resume()
    for step, batch in enumerate(accelerator.skip_first_batches(loader, start), start):
        if step >= args.steps:
            break
        loss = tiny_lm.shifted_cross_entropy(model(batch), batch)
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        if args.step_delay:
            time.sleep(args.step_delay)
        if spot.step(step + 1):
            return 0
    spot.save(args.steps, "final")
    print(f"finished {args.steps} steps", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
