"""Fixtures: a tiny real training state and a checkpoint root per test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from respawn import protocol
from respawn.checkpoint import CheckpointConfig
from respawn.examples import tiny

ROOT_DIR = Path(__file__).resolve().parents[2]
TOKEN = "a-token-of-this-gang"  # the memory tier's buddy stores'


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


class Buddy:
    """A buddy store in its own process, as on another node."""

    def __init__(self, holds_for: int, own: int | None = None):
        mine = ["--own", str(own)] if own is not None else []
        self.process = subprocess.Popen([sys.executable, "-m", "respawn.checkpoint.tiers", "--holds-for", str(holds_for), *mine],
                                        stdout=subprocess.PIPE, text=True, env={**os.environ, protocol.ENV_MEMORY_TIER_TOKEN: TOKEN})
        word, host, port = self.process.stdout.readline().split()
        assert word == "listening"
        self.address = (host, int(port))

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")


@pytest.fixture
def buddies():
    started = []

    def start(holds_for: int, own: int | None = None) -> Buddy:
        started.append(Buddy(holds_for, own))
        return started[-1]

    yield start
    for buddy in started:
        if buddy.process.poll() is None:
            buddy.kill()
