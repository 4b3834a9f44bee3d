"""A gang's training loop with sharded checkpoints (agents/respawn/checkpoint/sharded.py), on CPU.

    torchrun --nproc-per-node 2 -m respawn.examples.dcp_loop --uri /tmp/ckpt --wrap fsdp --steps 20

`--wrap ddp` keeps a replica per rank (DistributedDataParallel), `fsdp` shards it
with FSDP2's `fully_shard`. `--global-batch` stays the same whatever the world size, so
a run stopped on 4 ranks continues on 2 with the same sample order.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

from respawn import trainer
from respawn.checkpoint import CheckpointConfig, ResumableSampler, ShardedCheckpointer, ShardedState
from respawn.checkpoint.distributed import init_process_group, leave_process_group

DATASET_SIZE = 512
FEATURES = 16


def make_model(width: int = 64, depth: int = 3) -> torch.nn.Sequential:
    """The unwrapped model (also the validation model factory, `respawn.examples.dcp_loop:make_model`)."""
    layers = [torch.nn.Linear(FEATURES if i == 0 else width, width) for i in range(depth)]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))


def validation_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed batch the reference loss scores (`respawn.examples.dcp_loop:validation_batch`)."""
    x, y = dataset()
    return x[:64], y[:64]


def build(wrap: str, width: int = 64, depth: int = 3, global_batch: int = 8, init_seed: int = 0,
          device: str = "cpu") -> ShardedState:
    """The model (initial weights from `init_seed`, the same on every rank) on `device`
    ("cuda": the rank's current one), optimizer and sampler of one rank of an
    initialised gang."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if global_batch % world:
        raise ValueError(f"global batch {global_batch} does not split over {world} ranks")
    torch.manual_seed(init_seed)
    model = make_model(width, depth).to(device)
    if wrap == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif wrap == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(torch.device(device).type, (world,))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        raise ValueError(f"wrap={wrap!r} is not ddp or fsdp")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sampler = ResumableSampler(DATASET_SIZE, global_batch // world, seed=0, rank=rank, world_size=world)
    return ShardedState(model, optimizer, sampler=sampler)


def full_state(state: ShardedState) -> dict:
    """Model and optimizer as one unsharded state, gathered on every rank: what a resharded
    resume must reproduce bit for bit."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model, optim = get_state_dict(state.model, state.optimizer, options=StateDictOptions(full_state_dict=True))
    return {"model": model, "optim": optim}


def first_difference(a, b, where: str = "state") -> str | None:
    """Where two nested states first differ (tensors compared bitwise), or None."""
    if isinstance(a, torch.Tensor):
        same = isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        return None if same else where
    if isinstance(a, dict) or isinstance(a, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b) or isinstance(a, dict) and a.keys() != b.keys():
            return where
        keys = a.keys() if isinstance(a, dict) else range(len(a))
        return next((d for k in keys if (d := first_difference(a[k], b[k], f"{where}.{k}")) is not None), None)
    return None if a == b else where


def dataset(device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(DATASET_SIZE, FEATURES, generator=g)
    return x.to(device), x.sum(dim=1, keepdim=True).sin().to(device)


def train_step(state: ShardedState, data: tuple[torch.Tensor, torch.Tensor]) -> float:
    idx = state.sampler.next_batch()
    x, y = data
    loss = torch.nn.functional.mse_loss(state.model(x[idx]), y[idx])
    state.optimizer.zero_grad()
    loss.backward()
    state.optimizer.step()
    return loss.item()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--uri", default=os.environ.get("RESPAWN_CHECKPOINT_URI", ""),
                        help="checkpoint root (default: $RESPAWN_CHECKPOINT_URI, which the agent sets)")
    parser.add_argument("--wrap", choices=("ddp", "fsdp"), default="fsdp")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--global-batch", type=int, default=8,
                        help="samples per step over all ranks; every world size the job runs on must divide it")
    parser.add_argument("--step-delay", type=float, default=0.0, help="sleep per step, to make a short run last")
    args = parser.parse_args()
    if not args.uri:
        parser.error("--uri is needed where RESPAWN_CHECKPOINT_URI is not set")
    init_process_group("gloo")
    state = build(args.wrap, global_batch=args.global_batch)
    ckpt = ShardedCheckpointer(state, CheckpointConfig.from_env(uri=args.uri, every_steps=args.every))
    data = dataset()
    for step in range(ckpt.load_latest().step, args.steps):
        loss = train_step(state, data)
        trainer.report(step + 1, loss)  # each rank's progress to its own agent (one rank a VM)
        ckpt.save(step + 1)
        if ckpt.should_stop:
            break
        time.sleep(args.step_delay)
    else:
        ckpt.finish(args.steps)
    ckpt.close()
    leave_process_group()


if __name__ == "__main__":
    main()
