"""A tiny deterministic classifier trained under the Checkpointer.

Run: `python -m respawn.examples.tiny --uri /tmp/ckpt --steps 300 --every-steps 25`.
Kill it at any moment (SIGKILL, or SIGTERM for a notice save) and run it again:
it resumes and ends with bitwise the same weights as an uninterrupted run.

Validation factories for the agent / `python -m respawn.checkpoint.validate`:
    RESPAWN_MODEL_FACTORY=respawn.examples.tiny:make_model
    RESPAWN_BATCH_FACTORY=respawn.examples.tiny:validation_batch
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from respawn import trainer
from respawn.checkpoint import CheckpointConfig, Checkpointer, ResumableSampler, TrainState, ValidationSettings

FEATURES, CLASSES, DATASET_SIZE, BATCH = 16, 4, 512, 32
HIDDEN = int(os.environ.get("TINY_HIDDEN", "64"))  # the factories must agree with the script
VALIDATION = ValidationSettings("respawn.examples.tiny:make_model", "respawn.examples.tiny:validation_batch", tolerance=1e-5)


def make_model() -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)
        return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Dropout(0.1),
                             nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def dataset() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(99)
    x = torch.randn(DATASET_SIZE, FEATURES, generator=g)
    y = (x[:, :CLASSES].argmax(dim=1) + (x[:, -1] > 1).long()) % CLASSES
    return x, y


def validation_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """One training-sized batch drawn with a fixed seed."""
    x, y = dataset()
    idx = torch.randperm(DATASET_SIZE, generator=torch.Generator().manual_seed(7))[:BATCH]
    return x[idx], y[idx]


def build(seed: int = 0, rank: int = 0, world_size: int = 1, batch_size: int = BATCH):
    """Model, optimizer, scheduler and sampler of a run, ready for a TrainState; `batch_size`
    samples a step on each rank."""
    torch.manual_seed(seed + rank)
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.9)
    sampler = ResumableSampler(DATASET_SIZE, batch_size, seed=seed, rank=rank, world_size=world_size)
    return TrainState(model, optimizer, scheduler, sampler=sampler)


def train_step(state: TrainState, x: torch.Tensor, y: torch.Tensor, model: nn.Module | None = None) -> float:
    """One step; `model` is what runs forward/backward (e.g. a DDP wrapper of state.model)."""
    idx = state.sampler.next_batch()
    state.optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy((model or state.model)(x[idx]), y[idx])
    loss.backward()
    state.optimizer.step()
    state.scheduler.step()
    return loss.detach().item()


def single_process() -> tuple[TrainState, nn.Module]:
    """The state of a one-process run, and the module that runs forward/backward: its model."""
    if not torch.are_deterministic_algorithms_enabled():
        torch.use_deterministic_algorithms(True)  # slow the first time (imports inductor): callers may do it early
    state = build()
    return state, state.model


def train(config: CheckpointConfig, steps: int, step_delay_s: float = 0.0, *,
          setup: Callable[[], tuple[TrainState, nn.Module]] = single_process, report: bool = True) -> Checkpointer:
    """Train to `steps`, resuming from the newest valid checkpoint; returns the
    closed Checkpointer (its `should_stop` says whether a stop cut the run short).
    `setup` builds the state and the module that trains it (tiny_gang: one rank's
    share, wrapped in DistributedDataParallel); `report` sends progress to the agent."""
    state, model = setup()
    x, y = dataset()
    ckpt = Checkpointer(state, config)
    state.model.train()
    for step in range(ckpt.load_latest().step, steps):
        began = time.monotonic()
        loss = train_step(state, x, y, model)
        if step_delay_s:
            time.sleep(step_delay_s)
        if report:
            trainer.report(step + 1, loss, BATCH / max(time.monotonic() - began, 1e-9))
        ckpt.save(step + 1)
        if ckpt.should_stop:
            ckpt.close()
            return ckpt
    ckpt.finish(steps)
    return ckpt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default=os.environ.get("RESPAWN_CHECKPOINT_URI", ""))
    parser.add_argument("--steps", type=int, default=int(os.environ.get("RESPAWN_TOTAL_STEPS", "300")))
    parser.add_argument("--every-steps", type=int, default=None)
    parser.add_argument("--step-delay", type=float, default=0.0, help="sleep per step, to make a short run last")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # bitwise reproducibility does not survive a change of thread count
    config = CheckpointConfig.from_env(uri=args.uri, every_steps=args.every_steps, validation=VALIDATION)
    ckpt = train(config, args.steps, args.step_delay)
    print(f"stopped at step {ckpt.last_outcome.step}" if ckpt.should_stop else f"finished {args.steps} steps", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
