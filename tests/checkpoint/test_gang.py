"""Two ranks over gloo: each writes its own shard, rank 0 commits after both wrote,
and a stop raised on rank 1 only reaches rank 0 at the next step, so both save
the same step; the resumed gang ends bitwise where an uninterrupted one does."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import torch

from respawn.checkpoint import init_process_group, leave_process_group
from respawn.checkpoint import layout
from respawn.checkpoint.reader import CheckpointRef, committed, load
from respawn.checkpoint.storage.local import LocalStorage
from respawn.examples import tiny_gang

from .conftest import config
from .ranks import fork_ranks, wait_all

STEPS = 120
WORLD = 2


def start_gang(root: str) -> list[int]:
    """Fork one process per rank running tiny_gang to STEPS (resuming if it can)."""

    def run_rank(rank: int, port: int) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # until the Checkpointer installs its handler
        init_process_group("gloo", timeout_s=30, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
        ckpt = tiny_gang.train(config(root, every_steps=10, handle_signals=True), STEPS)
        Path(root, f"exit-rank{rank}.json").write_text(json.dumps({"stopped": ckpt.should_stop, "step": ckpt.last_outcome.step}))
        leave_process_group()

    return fork_ranks(WORLD, run_rank)


def final_tensors(root: str, rank: int) -> dict[str, torch.Tensor]:
    state = load(CheckpointRef(LocalStorage(root), layout.step_dir(STEPS)), rank).state
    tensors = {f"model.{k}": v for k, v in state["model"].items()}
    for index, moments in state["optimizer"]["state"].items():
        tensors |= {f"optimizer.{index}.{k}": v for k, v in moments.items()}
    return tensors


def test_a_stop_on_rank_1_only_saves_the_same_step_on_both_and_resume_is_exact(tmp_path):
    torch.use_deterministic_algorithms(True)
    reference = str(tmp_path / "reference")
    assert wait_all(start_gang(reference)) == [0, 0]

    root = str(tmp_path / "stopped")
    pids = start_gang(root)
    deadline = time.monotonic() + 60
    while not committed(LocalStorage(root)) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(pids[1], signal.SIGTERM)  # rank 1 only
    assert wait_all(pids) == [0, 0]
    exits = [json.loads(Path(root, f"exit-rank{r}.json").read_text()) for r in range(WORLD)]
    assert all(e["stopped"] for e in exits), exits
    assert exits[0]["step"] == exits[1]["step"] < STEPS
    notice = CheckpointRef(LocalStorage(root), layout.step_dir(exits[0]["step"]))
    assert notice.is_committed()
    files = set(json.loads(Path(root, notice.name, layout.MANIFEST).read_text())["files"])
    assert {"state.json", "state-rank1.json", "data-r0-0.bin", "data-r1-0.bin"} <= files

    assert wait_all(start_gang(root)) == [0, 0]
    for rank in range(WORLD):
        expected, actual = final_tensors(reference, rank), final_tensors(root, rank)
        assert expected.keys() == actual.keys()
        for name in expected:
            assert torch.equal(expected[name], actual[name]), f"rank {rank} {name}"
    assert json.loads(Path(root, layout.step_dir(STEPS), layout.VALIDATION).read_text())["result"] == "valid"


def test_a_dead_rank_makes_the_other_fail_instead_of_hanging(tmp_path):
    root = str(tmp_path / "dead")
    pids = start_gang(root)
    deadline = time.monotonic() + 60
    while not committed(LocalStorage(root)) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(pids[1], signal.SIGKILL)
    codes = wait_all(pids)  # returns: rank 0's next collective errors out (timeout 30 s at worst)
    assert codes == [1, -signal.SIGKILL]
    assert not Path(root, "exit-rank0.json").exists()
    assert all(ref.is_committed() for ref in committed(LocalStorage(root)))
