"""The Checkpointer end to end on each object store: periodic saves commit, rotation
keeps the last two, a resumed run restores bitwise the state it saved, and a step
directory without a manifest (a save cut short) is never loaded."""

from __future__ import annotations

import pytest
import torch

from respawn.checkpoint import CheckpointConfig, Checkpointer, layout
from respawn.checkpoint.reader import committed
from respawn.checkpoint.storage import open_storage
from respawn.examples import tiny

from .conftest import CLOUD_BACKENDS


@pytest.fixture(autouse=True)
def _one_thread():
    # Bitwise comparisons need the same thread count in the saving and the resumed run.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def config(uri: str) -> CheckpointConfig:
    return CheckpointConfig(uri=uri, every_steps=5, num_files=2, validation=tiny.VALIDATION, handle_signals=False)


@pytest.mark.parametrize("backend", CLOUD_BACKENDS)
def test_the_checkpointer_saves_rotates_and_resumes_bitwise_on_an_object_store(backend, cloud_uri):
    state = tiny.build()
    x, y = tiny.dataset()
    ckpt = Checkpointer(state, config(cloud_uri))
    for step in range(15):
        tiny.train_step(state, x, y)
        if ckpt.save(step + 1):
            ckpt.wait()  # commit each save (a fast loop would otherwise defer the next ones)
    ckpt.close()
    storage = open_storage(cloud_uri)
    # A save cut short: data landed, the manifest never did.
    storage.write_atomic(f"{layout.step_dir(20)}/{layout.data_file(0, 0)}", b"partial")

    assert [ref.step for ref in committed(storage)] == [10, 15]
    resumed = tiny.build()  # freshly initialised: differs from the trained state until loaded
    assert not torch.equal(resumed.model[0].weight, state.model[0].weight)
    assert Checkpointer(resumed, config(cloud_uri)).load_latest().step == 15
    for name, tensor in state.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], tensor), name
    saved_moments = [s["exp_avg"] for s in state.optimizer.state_dict()["state"].values()]
    resumed_moments = [s["exp_avg"] for s in resumed.optimizer.state_dict()["state"].values()]
    assert all(torch.equal(a, b) for a, b in zip(saved_moments, resumed_moments, strict=True))
    assert resumed.sampler.state_dict() == state.sampler.state_dict()
