"""A periodic save's report says what a notice save of the same state would take: its
time less the pacing (which spreads it over the interval on purpose), so the agent
can compare it with the cloud's notice window before any notice comes."""

from __future__ import annotations

import json

import torch
from torch import nn

from respawn import protocol
from respawn.checkpoint import CheckpointConfig, Checkpointer, TrainState
from respawn.checkpoint.persist import CHUNK_BYTES
from tests.conftest import wait_until

PACED_OVER_S = 3.0


def big_state() -> TrainState:
    # Weights of three chunks, in one tensor: the pace holds the 2nd and 3rd chunks back.
    model = nn.Linear(CHUNK_BYTES * 3 // 4 // 2048, 2048, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return TrainState(model, optimizer)


def reports(path) -> list[protocol.CheckpointReport]:
    return [protocol.from_dict(protocol.CheckpointReport, json.loads(line)) for line in path.read_text().splitlines()]


def test_the_persist_time_leaves_out_the_pacing_and_a_notice_save_has_none(tmp_path):
    reported = tmp_path / "checkpoints.jsonl"
    config = CheckpointConfig(uri=str(tmp_path / "ckpt"), interval_s=PACED_OVER_S, pace_fraction=1.0, num_files=2,
                              write_live_fraction=0.0, handle_signals=False, checkpoints_file=str(reported))
    ckpt = Checkpointer(big_state(), config)
    outcome = ckpt.save(1, kind="periodic")  # paced over PACED_OVER_S
    # Not wait(): it would finish the persist at full speed. Alone, the persist commits itself.
    wait_until(lambda: outcome.committed is not None, timeout=60, what="the paced persist's commit")
    assert outcome.committed
    ckpt.save(2, kind="notice")
    ckpt.close()
    periodic, notice = reports(reported)
    assert (periodic.kind, notice.kind) == ("periodic", "notice")
    # The 2nd and 3rd chunks were due 1/3 and 2/3 into the pace: that waiting is in
    # the save's time and out of the persist's.
    assert periodic.save_s - periodic.persist_s >= PACED_OVER_S / 3
    assert 0 < periodic.persist_s < periodic.save_s
    assert 0 < notice.persist_s <= notice.save_s
    assert notice.save_s - notice.persist_s < periodic.save_s - periodic.persist_s
