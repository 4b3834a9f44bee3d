"""Exact resume, the test users will trust: a real model trained in forked children,
killed at random moments (SIGKILL anywhere, SIGKILL mid-persist, SIGTERM with a
notice save), resumed each time. Every committed checkpoint left behind must
verify, and the final weights and optimizer state must be bitwise those of the
uninterrupted run, and nothing the kills left may stay on disk once the resumed
run ended. bench/crash.py runs the same trials by the hundred."""

from __future__ import annotations

import random

from respawn.examples import crash_trials

TRIALS_PER_MODE = 8


def test_killed_and_resumed_runs_end_bitwise_identical_and_never_load_a_torn_checkpoint(tmp_path):
    seed = random.randrange(1 << 30)  # a fresh draw each run; printed on failure to replay it
    results = crash_trials.run_trials(3 * TRIALS_PER_MODE, str(tmp_path), seed=seed)
    problems = [f"seed {seed} trial {i} ({r.mode}): {r.problem}" for i, r in enumerate(results) if r.problem]
    assert not problems, "\n".join(problems)
    mid_persist = [r for r in results if r.mode == "mid-persist"]
    assert sum(r.torn_after_kill for r in mid_persist) > 0, "no kill landed inside a persist"
    sigterm = [r for r in results if r.mode == "sigterm"]
    assert all(r.torn_after_kill == 0 for r in sigterm), "a SIGTERM stop left an uncommitted notice save"
