"""The Checkpointer on CUDA: a model and AdamW restored bitwise; a periodic save's copy to
the host queued on a side stream, running beside the next forward/backward and holding
exactly the state of the step it was asked at, because the optimizer's update waits for
it on the GPU, while neither save() nor that wait holds up the host.

The state of the overlap tests is about 1 GiB (weights and AdamW's moments): its copy to
the host takes 15 ms or more at PCIe 5 speed, against about a millisecond for the next
step's forward/backward and update of a batch of 8, so an update that did not wait
would overtake the copy (the `optimizer_waits=False` case shows it does)."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from respawn.checkpoint import CheckpointConfig, Checkpointer, TrainState, layout
from respawn.checkpoint.reader import CheckpointRef, load
from respawn.checkpoint.storage.local import LocalStorage
from respawn.examples.dcp_loop import first_difference

from . import CUDA, on_host

pytestmark = CUDA

WIDTH = 4096
LAYERS = 5  # 5 x (4096 x 4096 + 4096) float32 weights, x 3 with the moments: 1.0 GB


def build(seed: int = 0, layers: int = LAYERS) -> TrainState:
    torch.manual_seed(seed)
    # BatchNorm's running statistics change in the forward pass: copied before the next one runs.
    model = nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(layers)), nn.BatchNorm1d(WIDTH)).cuda()
    return TrainState(model, torch.optim.AdamW(model.parameters(), lr=1e-3))


def forward_backward(state: TrainState) -> None:
    state.optimizer.zero_grad(set_to_none=True)
    state.model(torch.randn(8, WIDTH, device="cuda")).square().mean().backward()


def train_step(state: TrainState) -> None:
    forward_backward(state)
    state.optimizer.step()


def saved_now(state: TrainState) -> dict:
    return on_host({"model": state.model.state_dict(), "optimizer": state.optimizer.state_dict()})


def checkpointer(state: TrainState, root: str, **kwargs) -> Checkpointer:
    return Checkpointer(state, CheckpointConfig(uri=root, interval_s=3600, num_files=2, handle_signals=False), **kwargs)


def warm(ckpt: Checkpointer, state: TrainState) -> None:
    """A first periodic save: it allocates the pinned host buffers the next ones reuse."""
    ckpt.save(1, kind="periodic")
    train_step(state)
    ckpt.wait()


def loaded(root: str, step: int) -> dict:
    state = load(CheckpointRef(LocalStorage(root), layout.step_dir(step))).state
    return {"model": state["model"], "optimizer": state["optimizer"]}


def test_a_cuda_model_and_adamw_resume_bitwise(tmp_path):
    root = str(tmp_path / "ckpt")
    state = build(layers=2)
    for _ in range(3):
        train_step(state)
    ckpt = checkpointer(state, root)
    assert ckpt.save(3, kind="notice").committed
    ckpt.close()
    written = saved_now(state)
    fresh = build(seed=1, layers=2)
    assert first_difference(written, saved_now(fresh)) is not None  # the load has something to do
    resumed = checkpointer(fresh, root)
    assert resumed.load_latest().step == 3
    resumed.close()
    assert first_difference(written, saved_now(fresh)) is None
    assert all(p.is_cuda for p in fresh.model.parameters())
    assert all(m.is_cuda for s in fresh.optimizer.state.values() for k, m in s.items() if k != "step")


@pytest.mark.parametrize("optimizer_waits", [True, False])
def test_a_periodic_save_holds_the_state_it_was_asked_at_though_the_next_step_runs_at_once(tmp_path, optimizer_waits):
    root = str(tmp_path / "ckpt")
    state = build()
    train_step(state)
    ckpt = checkpointer(state, root, hook_optimizer=optimizer_waits)
    warm(ckpt, state)
    before = saved_now(state)
    outcome = ckpt.save(2, kind="periodic")
    train_step(state)
    ckpt.wait()
    assert outcome.committed, outcome.message
    assert first_difference(before["model"], saved_now(state)["model"]) is not None  # the step did run
    difference = first_difference(before, loaded(root, 2))
    if optimizer_waits:
        assert difference is None, f"the checkpoint of step 2 differs from the state at that step at {difference}"
    else:
        # Without the wait (no optimizer hook) the update overtakes the copy: the check above has teeth.
        assert difference is not None, "the copy finished before an update that did not wait for it: this test proves nothing"


def busy_for(seconds: float) -> None:
    """Keep the current stream busy for about `seconds`, the host going on."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10**7)
    end.record()
    end.synchronize()
    torch.cuda._sleep(int(10**7 * seconds * 1000 / start.elapsed_time(end)))


def test_neither_the_save_nor_the_update_waiting_for_its_copy_holds_up_the_host(tmp_path):
    state = build()
    train_step(state)
    ckpt = checkpointer(state, str(tmp_path / "ckpt"))
    warm(ckpt, state)
    busy_for(1.0)  # the copies queue behind this, and the training stream's next kernels too
    began = time.perf_counter()
    outcome = ckpt.save(2, kind="periodic")
    saved_s = time.perf_counter() - began
    train_step(state)  # the optimizer's step pre-hook makes the update wait for the copies
    took_s = time.perf_counter() - began
    still_busy = not torch.cuda.current_stream().query()
    ckpt.wait()
    assert outcome.committed, outcome.message
    assert still_busy, (f"save() and the next step returned only once the GPU was idle ({saved_s:.3f} s, "
                        f"{took_s:.3f} s): one of them synchronised the device")


def test_the_next_forward_backward_runs_beside_the_copy(tmp_path):
    state = build()
    train_step(state)
    ckpt = checkpointer(state, str(tmp_path / "ckpt"))
    warm(ckpt, state)
    ckpt.save(2, kind="periodic")
    copies = ckpt._inflight.device  # the events recorded after the copies, per device
    forward_backward(state)
    torch.cuda.current_stream().synchronize()
    copying = not all(event.query() for _, event in copies.done)
    state.optimizer.step()
    ckpt.wait()
    assert copying, "the forward/backward after a save ran only once its copy to the host had finished"
