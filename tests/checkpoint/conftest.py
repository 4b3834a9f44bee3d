"""Fixtures: a tiny real training state and a checkpoint root per test."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from respawn.checkpoint import CheckpointConfig
from respawn.examples import tiny

ROOT_DIR = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _one_thread():
    # Bitwise comparisons need the same thread count in every run of a test.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "ckpt")


@pytest.fixture
def state():
    return tiny.build()


@pytest.fixture
def data():
    return tiny.dataset()


def config(uri: str, **overrides) -> CheckpointConfig:
    values = {"uri": uri, "every_steps": 5, "num_files": 2, "validation": tiny.VALIDATION, "handle_signals": False}
    return CheckpointConfig(**(values | overrides))


def train(state, data, ckpt, start: int, stop: int) -> None:
    x, y = data
    for step in range(start, stop):
        tiny.train_step(state, x, y)
        ckpt.save(step + 1)
