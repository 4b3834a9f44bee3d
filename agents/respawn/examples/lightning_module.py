"""An unmodified Lightning script plus one line (`spot_safe(trainer)`).

A tiny causal LM (agents/respawn/examples/tiny_lm.py, dropout on) learns random token
sequences from a ResumableLoader, so a resume continues mid-epoch on the same batches:

    python -m respawn.examples.lightning_module --uri /tmp/ckpt --steps 60

A SIGTERM saves at the next step boundary and exits 0; running it again resumes there.
"""

from __future__ import annotations

import time

import lightning as L
import torch

from respawn.checkpoint import CheckpointConfig, ResumableLoader
from respawn.examples import framework_cli, tiny_lm
from respawn.integrations.lightning import spot_safe


class LitLM(L.LightningModule):
    def __init__(self, n_embd: int = 16, step_delay: float = 0.0):
        super().__init__()
        torch.manual_seed(0)
        self.model = tiny_lm.TinyGPT(tiny_lm.Config(n_embd=n_embd))
        self.step_delay = step_delay

    def training_step(self, batch, batch_idx):
        if self.step_delay:
            time.sleep(self.step_delay)
        return tiny_lm.shifted_cross_entropy(self.model(batch), batch)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.9)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def main(argv: list[str] | None = None) -> int:
    parser = framework_cli.parser(__doc__.splitlines()[0])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # bitwise reproducibility does not survive a change of thread count
    loader = ResumableLoader(tiny_lm.tokens(96, seed=1), batch_size=8, seed=0, shuffle=True, num_workers=args.workers,
                             persistent_workers=args.persistent_workers and args.workers > 0)
    trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=args.uri)
    spot_safe(trainer, CheckpointConfig.from_env(uri=args.uri, every_steps=args.every_steps))  # the one line
    trainer.fit(LitLM(args.n_embd, args.step_delay), loader)
    print(f"finished {args.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
