"""The save policy both checkpointers decide by (agents/respawn/checkpoint/policy.py), on its
own: each case is one `save()` call's situation and what it must do."""

from __future__ import annotations

import pytest

from respawn.checkpoint.policy import NOT_YET, Decision, SaveClock, all_done, decide, due

PERIODIC, NOTICE, FINAL = "periodic", "notice", "final"


def row(stop=0, now=0, due=0, busy=0, written=NOT_YET, failed=NOT_YET) -> list[int]:
    return [stop, now, due, busy, written, failed]


IDLE = row()


@pytest.mark.parametrize("step, last, elapsed_s, every_steps, interval_s, expected", [
    (10, 5, 0.0, 5, 600.0, True),       # every_steps steps since the last save
    (9, 5, 0.0, 5, 600.0, False),
    (9, 5, 1e6, 5, 600.0, False),       # by steps, the clock does not count
    (1, 0, 600.0, None, 600.0, True),   # by time: the interval has passed
    (1, 0, 599.9, None, 600.0, False),
    (100, 0, 0.5, None, 600.0, False),  # by time, steps do not count
])
def test_a_save_is_due_by_steps_when_set_else_by_time(step, last, elapsed_s, every_steps, interval_s, expected):
    assert due(step, last, elapsed_s, every_steps=every_steps, interval_s=interval_s) is expected


@pytest.mark.parametrize("asked, table, busy, last, due_here, expected", [
    # Nothing asked, nothing due: no save.
    (None, [IDLE], False, 0, False, Decision(None)),
    (None, None, False, 0, False, Decision(None)),  # a gang's call that reads no table
    # Due by rank 0's clock: a periodic save, in the background.
    (None, [row(due=1), IDLE], False, 0, False, Decision(PERIODIC)),
    # Only rank 1's clock says due: rank 0 decides for the gang, so not yet.
    (None, [IDLE, row(due=1)], False, 0, False, Decision(None)),
    # SIGUSR1 on any rank: a periodic save.
    (None, [IDLE, row(now=1)], False, 0, False, Decision(PERIODIC)),
    # One in flight: the due save is deferred to the first call after it.
    (None, [row(due=1)], True, 0, False, Decision(None)),
    (PERIODIC, None, True, 0, False, Decision(None)),
    # This step is saved already.
    (None, [row(due=1)], False, 7, False, Decision(None)),
    (PERIODIC, [IDLE], False, 7, False, Decision(None)),
    # Asked for a periodic save, at a call without a table.
    (PERIODIC, None, False, 0, False, Decision(PERIODIC)),
    # Due by steps, which every rank sees at the same call: a backend whose saves wait
    # for the previous one starts it without a table.
    (None, None, False, 0, True, Decision(PERIODIC)),
    (None, None, True, 0, True, Decision(None)),
    # Asked notice and final saves are made now, in flight or not, saved or not.
    (NOTICE, None, True, 7, False, Decision(NOTICE, now=True)),
    (FINAL, [IDLE], False, 7, False, Decision(FINAL, now=True)),
    # A stop seen by any rank: a notice save now, and the loop stops.
    (None, [IDLE, row(stop=1)], True, 0, False, Decision(NOTICE, now=True, stop=True)),
    (None, [row(stop=1, due=1)], False, 7, False, Decision(NOTICE, now=True, stop=True)),
    # A stop at the final save keeps the caller's kind.
    (FINAL, [row(stop=1)], False, 0, False, Decision(FINAL, now=True, stop=True)),
])
def test_what_a_save_call_does(asked, table, busy, last, due_here, expected):
    assert decide(7, asked, table, busy=busy, last_saved_step=last, due_here=due_here) == expected


@pytest.mark.parametrize("table, expected", [
    ([row(busy=1, written=4), row(busy=1, written=4)], True),
    ([row(busy=1, written=4), row(busy=1, failed=4)], True),   # a failure is an end too: the save is given up
    ([row(busy=1, written=4), row(busy=1)], False),            # rank 1 still writing
    ([row(busy=1, written=2), row(busy=1, written=4)], False),  # rank 0's row is of an older save
])
def test_a_save_is_settled_once_every_rank_is_done_with_it(table, expected):
    assert all_done(table, 4) is expected


def test_the_clock_counts_from_the_last_save_begun():
    clock = SaveClock(every_steps=None, interval_s=10.0, now=100.0)
    assert not clock.due(1, now=109.0) and clock.due(1, now=110.0)
    clock.saved(5, now=110.0)
    assert clock.last_step == 5 and not clock.due(6, now=119.0) and clock.due(6, now=120.0)
    clock.interval_s = 2.0  # the agent's control file shortened it
    assert clock.due(6, now=112.0)


@pytest.mark.parametrize("every_steps, interval_s", [(None, 10.0), (10, 10.0)])
def test_a_step_in_no_storage_makes_the_next_save_call_due_by_steps_or_by_time(every_steps, interval_s):
    clock = SaveClock(every_steps=every_steps, interval_s=interval_s, now=100.0)
    clock.overdue(26)  # resumed from the memory tier at 26, newer than storage's newest
    assert clock.due(27, now=100.0)
    clock.saved(27, now=100.0)
    assert not clock.due(28, now=101.0)
