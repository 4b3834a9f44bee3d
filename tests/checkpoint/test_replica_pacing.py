"""K, how often a rank replicates to its buddy (agents/respawn/checkpoint/tiers/pacing.py):
the storage interval's rule (Young/Daly) applied to the memory tier's measured cost,
within the replication's own time and the storage interval."""

from __future__ import annotations

import math

import pytest

from respawn.checkpoint.policy import daly_interval
from respawn.checkpoint.tiers.pacing import implied_mtbi_s, replica_every_steps
from respawn.checkpoint.tiers.replicator import Replicator


def k(cost_s=0.05, wall_s=0.5, step_s=0.1, save_cost_s=5.0, interval_s=600.0) -> int:
    return replica_every_steps(replica_cost_s=cost_s, replica_wall_s=wall_s, step_s=step_s, save_cost_s=save_cost_s,
                               interval_s=interval_s)


def test_k_is_the_daly_optimum_for_the_replications_cost_at_the_m_the_storage_interval_implies():
    # A 5 s save every 600 s implies M = 600² / 10 = 36000 s; a replication costing 0.05 s
    # of training is worth making about every 600 * sqrt(0.05 / 5) = 60 s: 600 steps of 0.1 s.
    assert implied_mtbi_s(600.0, 5.0) == 36000.0
    optimum = daly_interval(0.05, 36000.0)
    assert 59 < optimum < 61
    assert k() == math.ceil(optimum / 0.1)


def test_a_cheaper_replication_is_made_more_often_and_a_dearer_one_less():
    assert k(cost_s=0.005) < k(cost_s=0.05) < k(cost_s=0.5)


def test_k_is_never_shorter_than_a_replication_takes_to_land():
    # Sent in 30 s, a replication every 3 s would only be skipped: every 300 steps.
    assert k(cost_s=0.0001, wall_s=30.0) == 300


def test_k_is_never_longer_than_the_storage_interval():
    assert k(cost_s=50.0, save_cost_s=5.0) == 6000  # 600 s of 0.1 s steps: a replica older than a checkpoint is no use


def test_without_a_measured_save_k_keeps_the_replications_stall_to_a_hundredth_of_training():
    # M unknown: no optimum. A stall of 0.05 s every 5 s of steps is 1 % of training time.
    assert k(save_cost_s=None, cost_s=0.05, wall_s=0.45) == 50
    assert k(save_cost_s=0.0, cost_s=0.05, wall_s=0.45) == 50  # a save that cost nothing says nothing of M either
    # A stall of nothing: the replication's own time, as ever, bounds it.
    assert k(save_cost_s=None, cost_s=0.0001, wall_s=0.45) == 5
    assert k(save_cost_s=None, cost_s=50.0, interval_s=600.0) == 6000  # and the storage interval


def test_k_needs_a_step_time():
    with pytest.raises(ValueError, match="step_s"):
        k(step_s=0.0)


def test_a_jobs_own_k_wins_and_until_a_replication_is_measured_the_next_step_replicates():
    nowhere = (("127.0.0.1", 1), "t")
    mine = Replicator(0, nowhere, nowhere, every_steps=7)
    assert mine.every_steps(step_s=0.1, save_cost_s=5.0, interval_s=600.0) == 7
    chosen = Replicator(0, nowhere, nowhere)
    assert chosen.every_steps(step_s=0.1, save_cost_s=5.0, interval_s=600.0) == 1
    chosen.cost_s, chosen.wall_s = 0.05, 0.5
    assert chosen.every_steps(step_s=0.1, save_cost_s=5.0, interval_s=600.0) == k()
