"""An unmodified Hugging Face Trainer script plus one line (`spot_safe(trainer)`).

A tiny GPT-2 built from a config (no hub) learns random token sequences. Run it under
the agent, or alone:

    python -m respawn.examples.hf_trainer --uri /tmp/ckpt --steps 60

A SIGTERM saves at the next step boundary and exits 0; running it again resumes there.
Validation factories (RESPAWN_MODEL_FACTORY / RESPAWN_BATCH_FACTORY):
respawn.examples.hf_trainer:make_model and respawn.examples.hf_trainer:validation_batch
(the default loss reads the model's own `ModelOutput.loss`).
"""

from __future__ import annotations

import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from respawn.checkpoint import CheckpointConfig
from respawn.examples import framework_cli
from respawn.integrations.hf import spot_safe

SEQ = 16


def make_model(n_embd: int = 16) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=n_embd, vocab_size=64, n_positions=SEQ))


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 256):
        self.ids = torch.randint(0, 64, (n, SEQ), generator=torch.Generator().manual_seed(1))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def validation_batch() -> dict[str, torch.Tensor]:
    ids = Tokens(8).ids
    return {"input_ids": ids, "labels": ids}


class Slow(TrainerCallback):
    """Stretches each step (for tests that signal a run in the middle)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


def main(argv: list[str] | None = None) -> int:
    parser = framework_cli.parser(__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default=None, help="Trainer's output_dir (default: beside the checkpoints)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # bitwise reproducibility does not survive a change of thread count
    training_args = TrainingArguments(
        output_dir=args.output_dir or os.path.join(args.uri, "..", "hf-output"), max_steps=args.steps,
        per_device_train_batch_size=8, learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=5,
        logging_steps=5, save_strategy="no", report_to="none", use_cpu=True, seed=0, disable_tqdm=True,
        dataloader_num_workers=args.workers, dataloader_persistent_workers=args.persistent_workers and args.workers > 0)
    trainer = Trainer(model=make_model(args.n_embd), args=training_args, train_dataset=Tokens(),
                      callbacks=[Slow(args.step_delay)] if args.step_delay else None)
    spot_safe(trainer, CheckpointConfig.from_env(uri=args.uri, every_steps=args.every_steps))  # the one line
    trainer.train()
    print(f"finished {args.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
