"""The signal conformance matrix: every script × every event, under the real agent.

    python bench/conformance.py [--check] [--cells all|fast] [-k EXPR] [--workers 2]

Runs tests/agent/test_notice_at_the_seams.py (the real agent, the real control plane,
the cloud's metadata emulator, real processes and signals) over every cell: {the
README's loop, the loop under `torchrun --nproc-per-node 2`, HF Trainer, Lightning,
Accelerate} × {no loader workers, 2 workers, 2 persistent workers}, and Flax/Orbax,
× {notice, checkpoint-now, kill mid-save, a notice whose deadline passes}. `--cells
fast` is the suite's subset. Each cell passes when the save the event asks for
commits (or, for a missed deadline, is recorded missed with the steps it cost), no
process of the tree survives, no torn directory is picked and the resumed run ends
bitwise equal to an uninterrupted one.

It prints one row per cell: pass/fail, the notice save's step, the seconds from the
notice commit to the last training process's exit under the agent (target <= 2: the
agent ends a trainer 1.5 s after it sees its notice commit, whatever its teardown still does),
and the steps a missed deadline cost. --check exits non-zero when any cell fails or
an exit took longer than the target.

To check your own script, run `respawn-agent preflight -- <your command>`: its notice
goes through the same delivery (the training processes the library registered, never
the process group), and its crash trial kills during a save.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXIT_TARGET_S = 2.0
TEST = "tests/agent/test_notice_at_the_seams.py::test_the_agents_signals_reach_the_trainer_not_its_helpers"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a cell fails or misses the exit target")
    parser.add_argument("--cells", choices=("all", "fast"), default="all", help="every cell, or the suite's subset")
    parser.add_argument("-k", default="", help="pytest -k expression to run some cells only (e.g. 'hf and notice')")
    parser.add_argument("--workers", default="2", help="pytest-xdist processes (default 2)")
    parser.add_argument("--smoke", action="store_true",
                        help="one cell (the README's loop under a notice), no xdist: the suite's run "
                             "that keeps the bench working")
    args = parser.parse_args(argv)
    if args.smoke:
        args.cells, args.k, args.workers = "all", "loop-no-workers-notice", "0"
    workdir = Path(tempfile.mkdtemp(prefix="respawn-conformance-"))
    results = workdir / "cells.jsonl"
    env = {**os.environ, "RESPAWN_CONFORMANCE_RESULTS": str(results)}
    env.pop("RESPAWN_CONFORMANCE", None)
    if args.cells == "all":
        env["RESPAWN_CONFORMANCE"] = "all"
    # A temporary folder of its own: pytest's default one, shared with the suite that runs this
    # bench's smoke, is made private (0700) again by every new pytest session, and the local
    # VMs of tests running beside it, users of their own, lost their way to their folders.
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", args.workers, "-rf",
               "--basetemp", str(workdir / "tmp"), TEST, *(["-k", args.k] if args.k else [])]
    print("running:", " ".join(command), flush=True)
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    passed = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    failed = [line.split("[", 1)[1].rsplit("]", 1)[0] for line in done.stdout.splitlines()
              if line.startswith("FAILED") and "[" in line]
    rows = sorted(passed, key=lambda r: r["cell"])
    width = max([len(r["cell"]) for r in rows] + [len(c) for c in failed] + [10])
    print(f"\n{'cell':<{width}}  result  notice step  commit->exit s (target <= {EXIT_TARGET_S:g})  steps lost")
    slow = []
    for r in rows:
        exit_s = r.get("commit_to_exit_s")
        if exit_s is not None and exit_s > EXIT_TARGET_S:
            slow.append(r["cell"])
        print(f"{r['cell']:<{width}}  {'pass':<6}  {str(r.get('notice_step', '-')):>11}  "
              f"{'-' if exit_s is None else f'{exit_s:.2f}':>30}  {str(r.get('steps_lost', '-')):>10}")
    for cell in failed:
        print(f"{cell:<{width}}  FAIL")
    print(f"\n{len(rows)} passed, {len(failed)} failed, {len(slow)} slower than {EXIT_TARGET_S:g} s from commit to exit")
    if done.returncode not in (0, 1):  # pytest itself failed (no such test, a collection error): no cell ran
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        return 2
    if args.check and (failed or slow or done.returncode != 0):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
