"""Kept and recomputed steps against a per-step lineage oracle over generated relaunch histories."""

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from respawn_server.jobs.money.costs import kept_and_recomputed

FOREIGN = 10_000  # a checkpoint written by another rank's instance: not in this slot


@dataclass
class Run:
    pk: int
    resume_step: int
    resume_from: int | None
    last_step: int
    writer: int | None  # index of the run whose work the resume checkpoint holds (oracle only)


@st.composite
def slots(draw):
    runs = []
    for i in range(draw(st.integers(1, 6))):
        candidates = [j for j, r in enumerate(runs) if r.last_step > r.resume_step]
        if candidates and draw(st.booleans()):
            j = draw(st.sampled_from(candidates))
            step = draw(st.integers(runs[j].resume_step + 1, runs[j].last_step))
            foreign = draw(st.booleans())
            if foreign:  # only the step is known: its origin is the latest run that reached it
                j = max(k for k, r in enumerate(runs) if r.resume_step < step <= r.last_step)
            resume, resume_from, writer = step, (FOREIGN + j if foreign else runs[j].pk), j
        else:
            resume, resume_from, writer = 0, None, None
        runs.append(Run(pk=100 + i, resume_step=resume, resume_from=resume_from,
                        last_step=resume + draw(st.integers(0, 40)), writer=writer))
    return runs


def oracle(runs):
    def owner(step, i):
        run = runs[i]
        return i if step > run.resume_step else owner(step, run.writer)

    kept = [0] * len(runs)
    for step in range(1, runs[-1].last_step + 1):
        kept[owner(step, len(runs) - 1)] += 1
    redone = [sum(1 for s in range(r.resume_step + 1, r.last_step + 1)
                  if any(earlier.last_step >= s for earlier in runs[:i])) for i, r in enumerate(runs)]
    return {r.pk: (kept[i], redone[i]) for i, r in enumerate(runs)}


@settings(max_examples=300, deadline=None)
@given(slots())
def test_kept_and_recomputed_steps_match_the_per_step_lineage(runs):
    assert kept_and_recomputed(runs) == oracle(runs)


def test_a_run_that_never_reached_the_resumed_step_keeps_nothing():
    # A: 0..130 writes step 100; B restarts from scratch and dies at 50; C resumes from A's step 100.
    runs = [Run(1, 0, None, 130, None), Run(2, 0, None, 50, None), Run(3, 100, 1, 160, 0)]
    assert kept_and_recomputed(runs) == {1: (100, 0), 2: (0, 50), 3: (60, 30)}
