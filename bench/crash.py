"""Crash consistency: SIGKILL (anywhere, or mid-persist) and SIGTERM trials of a real
training run, each resumed to the end.

    .venv/bin/python bench/crash.py                # 500 trials, a few minutes
    .venv/bin/python bench/crash.py --trials 50

Target: 100 % of restarts load a checkpoint that passes validation (resume
validates before training continues) and end bitwise identical to an
uninterrupted run; every committed checkpoint left by a kill verifies; nothing
a kill left (torn directories, temp files) is still on disk once the resumed run
ended. Trials fork from this process, which has already imported torch. Exit
status 1 on any failed trial.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from respawn.examples import crash_trials  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    parser.add_argument("--smoke", action="store_true",
                        help="one trial of each kind: the suite's run that keeps the bench working")
    args = parser.parse_args()
    if args.smoke:
        args.trials = 3  # run_trials takes its modes in turn: random, mid-persist, sigterm
    started = time.monotonic()
    by_mode: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    failures = []

    def progress(i: int, result: crash_trials.TrialResult) -> None:
        tally = by_mode[result.mode]
        tally["trials"] += 1
        tally["ok"] += result.identical
        tally["torn dirs left"] += result.torn_after_kill
        tally["left after resume"] += result.left_after_resume
        if result.problem:
            failures.append(f"trial {i} ({result.mode}): {result.problem}")
            print(failures[-1], flush=True)
        if (i + 1) % 50 == 0:
            print(f"{i + 1} trials, {time.monotonic() - started:.0f} s", flush=True)

    with tempfile.TemporaryDirectory(prefix="crash-bench-", dir=args.dir) as workdir:
        results = crash_trials.run_trials(args.trials, workdir, seed=args.seed, on_result=progress)
    ok = sum(r.identical for r in results)
    for mode, tally in sorted(by_mode.items()):
        print(f"{mode:<12} {tally['ok']}/{tally['trials']} restarts valid and bitwise identical; "
              f"{tally['torn dirs left']} torn directories left by kills (never loaded), "
              f"{tally['left after resume']} still on disk after the resumed run (target 0)")
    left = sum(r.left_after_resume for r in results)
    print(f"crash consistency: {ok}/{len(results)} = {100 * ok / max(1, len(results)):.1f} %   target 100 %   "
          f"leftovers after cleanup: {left}   target 0   ({time.monotonic() - started:.0f} s)")
    return 0 if ok == len(results) and left == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
