"""What checkpointing costs a gang per step when nothing is being saved.

    .venv/bin/python bench/distributed.py [--check] [--ranks 2] [--steps 100] [--step-ms 50]

Coordination: `--ranks` processes on 127.0.0.1 over gloo, each running `--steps`
steps of `--step-ms` (a sleep, as a GPU step leaves the CPU waiting, then a small
all_reduce on the user's group, as DDP keeps ranks in step) and calling
`Checkpointer.save()` after each with no save due (interval 1 h): all save() does is
the ranks' agreement on the coordinator's own gloo group. Per step: the time spent
inside save(), mean over steps, worst rank; divided by the step time.
--check: <= 0.01. Printed beside it: the same loop's wall time against a loop
without save() (noisier: the difference of two sleeps' sums), and what one blocking
all_gather of the same row on the same group costs (what every step paid before).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402  (after the path insert)
import torch.distributed as dist  # noqa: E402

from agents.checkpoint import CheckpointConfig, Checkpointer, init_process_group  # noqa: E402
from agents.examples import tiny  # noqa: E402
from tests.checkpoint.ranks import fork_ranks, wait_all  # noqa: E402

MAX_COORDINATION_RATIO = 0.01


def loop(steps: int, step_s: float, save=None) -> tuple[float, list[float]]:
    """Wall time of `steps` steps and the time each save() call took."""
    token = torch.zeros(4)
    in_save = []
    began = time.perf_counter()
    for step in range(steps):
        time.sleep(step_s)
        dist.all_reduce(token)
        if save is not None:
            t = time.perf_counter()
            save(step + 1)
            in_save.append(time.perf_counter() - t)
    return time.perf_counter() - began, in_save


def coordination_rank(rank: int, world: int, port: int, args, out: Path) -> None:
    init_process_group("gloo", timeout_s=60, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    step_s = args.step_ms / 1000
    with tempfile.TemporaryDirectory() as root:
        ckpt = Checkpointer(tiny.build(rank=rank, world_size=world),
                            CheckpointConfig(uri=root, interval_s=3600, handle_signals=False))
        dist.barrier()
        bare_s, _ = loop(args.steps, step_s)
        dist.barrier()
        with_s, in_save = loop(args.steps, step_s, ckpt.save)
        dist.barrier()
        row = torch.zeros(6, dtype=torch.int64)
        table = [torch.empty_like(row) for _ in range(world)]
        blocking = []
        for _ in range(args.steps):
            time.sleep(step_s / 10)  # ranks arrive a little apart, as they do after a step
            t = time.perf_counter()
            dist.all_gather(table, row, group=ckpt.coord.group)
            blocking.append(time.perf_counter() - t)
        ckpt.close()
    out.write_text(json.dumps({"bare_s": bare_s, "with_s": with_s, "in_save_s": statistics.fmean(in_save),
                               "max_in_save_s": max(in_save), "blocking_s": statistics.median(blocking)}))
    dist.barrier()
    dist.destroy_process_group()


def coordination(args) -> bool:
    with tempfile.TemporaryDirectory() as work:
        codes = wait_all(fork_ranks(args.ranks, lambda rank, port: coordination_rank(rank, args.ranks, port, args, Path(work, f"{rank}.json"))))
        if codes != [0] * args.ranks:
            raise SystemExit(f"ranks exited with {codes}")
        ranks = [json.loads(Path(work, f"{r}.json").read_text()) for r in range(args.ranks)]
    step_s = args.step_ms / 1000
    cost = max(r["in_save_s"] for r in ranks)
    ratio = cost / step_s
    wall = max(r["with_s"] - r["bare_s"] for r in ranks) / args.steps
    print(f"coordination, {args.ranks} gloo ranks, {args.steps} steps of {args.step_ms:g} ms:")
    print(f"  in save() per step {cost * 1e6:8.0f} us (worst call {max(r['max_in_save_s'] for r in ranks) * 1e3:.2f} ms)"
          f"  ratio {ratio:.4f}  target <= {MAX_COORDINATION_RATIO}")
    print(f"  wall difference per step {wall * 1e6:8.0f} us  ratio {wall / step_s:.4f}  (informative)")
    print(f"  one blocking all_gather {max(r['blocking_s'] for r in ranks) * 1e6:8.0f} us  "
          f"ratio {max(r['blocking_s'] for r in ranks) / step_s:.4f}  (what each step paid before)")
    return ratio <= MAX_COORDINATION_RATIO


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a ratio misses its target")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step-ms", type=float, default=50.0)
    args = parser.parse_args()
    ok = coordination(args)
    print("all targets met" if ok else "a target was missed")
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
