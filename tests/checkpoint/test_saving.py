"""When the Checkpointer saves, what a notice does, and what the agent sees."""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import torch

from respawn import protocol, trainer
from respawn.checkpoint import CheckpointConfig, Checkpointer, ConfigError, TrainState
from respawn.checkpoint.reader import committed
from respawn.checkpoint.storage.local import LocalStorage

from respawn.examples import tiny

from .conftest import config, train


def big_state() -> TrainState:
    """~48 MiB with Adam state: enough 8 MiB chunks for pacing to stretch a persist."""
    model = torch.nn.Linear(2048, 2048)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 2048)).sum().backward()
    optimizer.step()
    return TrainState(model, optimizer)


def committed_steps(root) -> list[int]:
    return [r.step for r in committed(LocalStorage(root))]


def test_it_saves_every_n_steps(root, state, data):
    ckpt = Checkpointer(state, config(root, every_steps=5, keep=10))
    started = []
    x, y = data
    for step in range(12):
        tiny.train_step(state, x, y)
        outcome = ckpt.save(step + 1)
        if outcome:
            started.append(outcome.step)
            ckpt.wait()
    ckpt.close()
    assert started == [5, 10]
    assert committed_steps(root) == [5, 10]


def test_it_saves_by_time_and_the_interval_can_change_at_run_time(root, state, data, tmp_path):
    control = tmp_path / "control.json"
    ckpt = Checkpointer(state, config(root, every_steps=None, interval_s=3600, control_file=str(control)))
    train(state, data, ckpt, 0, 3)
    assert committed_steps(root) == []
    control.write_text(json.dumps({"checkpoint_interval_s": 1e-9}))
    train(state, data, ckpt, 3, 4)
    assert ckpt.interval_s == 1e-9
    ckpt.close()
    assert committed_steps(root) == [4]


def test_a_save_due_while_a_persist_is_in_flight_is_deferred_until_it_finishes(root):
    ckpt = Checkpointer(big_state(), config(root, num_files=1, every_steps=None, interval_s=4, validation=None))
    first = ckpt.save(1, kind="periodic")
    assert first.committed is None  # in flight, paced over ~2 s
    ckpt.request_checkpoint()
    assert ckpt.save(2) is None  # deferred: the in-flight persist is not disturbed
    assert ckpt.wait().committed is True
    later = ckpt.save(3)  # the deferred request is served at the first step after
    assert later is not None and later.step == 3
    ckpt.close()
    assert committed_steps(root) == [1, 3]


def test_a_persist_still_running_a_whole_interval_later_is_finished_before_training_goes_on(root):
    """Its threads run only on idle cores; when training never leaves one idle, the
    next step past the interval waits for the persist rather than letting checkpoints
    fall behind, and that wait is the save's recorded stall."""
    ckpt = Checkpointer(big_state(), config(root, num_files=1, every_steps=None, interval_s=3600, validation=None))
    first = ckpt.save(1, kind="periodic")
    ckpt.set_interval(1e-6)  # so the in-flight persist is already an interval late
    ckpt.save(2)
    assert first.committed is True and committed_steps(root)[0] == 1
    assert first.stall_s > 0
    ckpt.close()


def test_the_reported_stall_has_what_the_steps_beside_a_persist_lost_not_only_the_blocking_part(root, tmp_path):
    """A periodic persist runs beside the loop's next steps; on a machine short of cores
    they take longer than steps without one. The stall the save reports (to the agent,
    the dashboard, the money) is what the loop saw: its blocking part and that after-effect.
    The steps here are made that much longer while the save is in flight."""
    reports = tmp_path / "checkpoints.jsonl"
    ckpt = Checkpointer(big_state(), config(root, num_files=1, every_steps=None, interval_s=4, validation=None,
                                            checkpoints_file=str(reports)))
    for step in range(1, 6):  # the loop's own step time, no save beside it
        time.sleep(0.01)
        ckpt.save(step)
    outcome = ckpt.save(6, kind="periodic")  # paced over ~2 s
    blocking, slower_by, step = outcome.stall_s, 0.0, 6
    while outcome.committed is None and step < 200:
        extra = 0.05
        time.sleep(0.01 + extra)
        slower_by += extra
        step += 1
        ckpt.save(step)
    ckpt.close()
    assert outcome.committed is True and slower_by > 0
    assert outcome.stall_s >= blocking + 0.8 * slower_by, (outcome.stall_s, blocking, slower_by)
    assert json.loads(reports.read_text().splitlines()[-1])["stall_s"] == outcome.stall_s  # what the agent is told


@pytest.mark.parametrize("overlap,live", [(True, 0.0), (True, 0.7), (False, 0.7)])
def test_a_periodic_save_holds_its_steps_weights_though_the_optimizer_steps_at_once(root, overlap, live):
    """With overlap the weights and Adam moments are copied beside the next step, or
    (`live`) the moments written straight from the optimizer's state; its step waits
    for both before it writes them."""
    state = big_state()
    saved = {k: v.clone() for k, v in state.model.state_dict().items()}
    moments = [(s["exp_avg"].clone(), s["exp_avg_sq"].clone()) for s in state.optimizer.state.values()]
    ckpt = Checkpointer(state, config(root, num_files=2, every_steps=None, interval_s=3600, validation=None,
                                      overlap_snapshot=overlap, write_live_fraction=live))
    assert ckpt.save(1, kind="periodic").committed is None
    state.model(torch.ones(1, 2048)).sum().backward()
    state.optimizer.step()  # at once: with overlap the copy has barely started
    ckpt.close()
    assert not torch.equal(state.model.weight, saved["weight"])  # the step did change the weights

    resumed = big_state()
    assert Checkpointer(resumed, config(root, validation=None)).load_latest().step == 1
    for name, tensor in resumed.model.state_dict().items():
        assert torch.equal(tensor, saved[name]), name
    for s, (exp_avg, exp_avg_sq) in zip(resumed.optimizer.state.values(), moments):
        assert torch.equal(s["exp_avg"], exp_avg) and torch.equal(s["exp_avg_sq"], exp_avg_sq)


@pytest.mark.parametrize("live,copied", [(0.0, 1.0), (0.7, 1 / 3), (None, 2 / 3)])
def test_the_moments_written_live_are_never_copied_so_a_save_holds_less_than_the_state(root, live, copied):
    """Host memory a user budgets for: the snapshot buffers hold the state but for what
    is written live (0.7: both 16 MiB moments of the weight; the local default, half the
    state: one of them), and the checkpoint still restores it all."""
    state = big_state()
    nbytes = sum(t.numel() * t.element_size() for t in (*state.model.parameters(),
                 *(m for s in state.optimizer.state.values() for m in s.values())))
    saved = [m.clone() for s in state.optimizer.state.values() for m in s.values()]
    ckpt = Checkpointer(state, config(root, num_files=2, validation=None, write_live_fraction=live))
    assert ckpt.save(1, kind="notice").committed
    assert ckpt.save(2, kind="periodic").committed is None
    ckpt.close()
    assert ckpt.host_buffer_bytes == pytest.approx(copied * nbytes, rel=0.01)

    resumed = big_state()
    assert Checkpointer(resumed, config(root, validation=None)).load_latest().step == 2
    assert all(torch.equal(a, b) for a, b in zip((m for s in resumed.optimizer.state.values() for m in s.values()), saved))


def test_a_notice_abandons_an_older_in_flight_persist_and_commits_its_own_step(root):
    ckpt = Checkpointer(big_state(), config(root, num_files=1, every_steps=None, interval_s=60, validation=None))
    ckpt.save(1, kind="periodic")  # paced over ~30 s
    outcome = ckpt.save(2, kind="notice")
    assert outcome.committed is True and outcome.step == 2
    ckpt.close()
    assert committed_steps(root) == [2]
    assert not list(Path(root).glob("step-00000001/*"))


def test_a_notice_that_cannot_meet_its_deadline_leaves_the_previous_checkpoint(root):
    ckpt = Checkpointer(big_state(), config(root, num_files=1, validation=None))
    assert ckpt.save(1, kind="notice").committed
    past = datetime.now(timezone.utc) - timedelta(seconds=1)
    outcome = ckpt.save(2, kind="notice", deadline=past)
    ckpt.close()
    assert outcome.committed is False
    assert "previous checkpoint step-00000001 is intact" in outcome.message
    assert committed_steps(root) == [1]


def test_sigterm_only_sets_a_flag_and_the_next_step_makes_a_notice_save(root, state, data):
    ckpt = Checkpointer(state, config(root, every_steps=1000, handle_signals=True))
    try:
        train(state, data, ckpt, 0, 3)
        os.kill(os.getpid(), signal.SIGTERM)
        assert committed_steps(root) == []  # nothing saved inside the handler
        assert not ckpt.should_stop
        train(state, data, ckpt, 3, 4)
        assert ckpt.should_stop
        assert ckpt.last_outcome.kind == "notice" and ckpt.last_outcome.committed
        assert committed_steps(root) == [4]
    finally:
        ckpt.close()
    assert signal.getsignal(signal.SIGTERM) is not ckpt._on_stop


def test_sigusr1_checkpoints_at_the_next_step_and_training_goes_on(root, state, data):
    ckpt = Checkpointer(state, config(root, every_steps=1000, handle_signals=True))
    try:
        train(state, data, ckpt, 0, 2)
        os.kill(os.getpid(), signal.SIGUSR1)
        train(state, data, ckpt, 2, 3)
        ckpt.wait()
        assert not ckpt.should_stop
        assert committed_steps(root) == [3]
    finally:
        ckpt.close()


def test_each_commit_is_reported_as_one_json_line_for_the_agent(root, state, data, tmp_path):
    reports = tmp_path / "checkpoints.jsonl"
    ckpt = Checkpointer(state, config(root, checkpoints_file=str(reports)))
    train(state, data, ckpt, 0, 5)
    ckpt.wait()
    ckpt.save(6, kind="notice")
    ckpt.close()
    lines = [json.loads(line) for line in reports.read_text().splitlines()]
    assert [(r["step"], r["kind"]) for r in lines] == [(5, "periodic"), (6, "notice")]
    report = protocol.from_dict(protocol.CheckpointReport, lines[0])
    assert report.uri == f"{root}/step-00000005"
    assert report.manifest_digest.startswith("xxh3_128:") and report.bytes > 0
    assert report.reference_loss is not None and report.stall_s >= 0
    assert len({r["checkpoint_id"] for r in lines}) == 2


def test_the_notice_deadline_comes_from_the_agents_notice_file(root, state, tmp_path):
    notice = tmp_path / "notice.json"
    gone = (datetime.now(timezone.utc) - timedelta(seconds=5)).isoformat()
    notice.write_text(json.dumps({"source": "aws_imds", "notice_time": gone, "deadline": gone}))
    ckpt = Checkpointer(state, config(root, notice_file=str(notice)))
    outcome = ckpt.save(1, kind="notice")
    ckpt.close()
    assert outcome.committed is False and "deadline" in outcome.message


def test_the_notice_files_deadline_is_not_cut_to_the_default_budget(root, state, tmp_path):
    # The agent's deadline (AWS: two minutes less the margin) wins over notice_budget_s,
    # here far shorter than any save, which holds only for notices without a deadline.
    notice = tmp_path / "notice.json"
    now = datetime.now(timezone.utc)
    notice.write_text(json.dumps({"source": "aws_imds", "notice_time": now.isoformat(),
                                  "deadline": (now + timedelta(seconds=108)).isoformat()}))
    ckpt = Checkpointer(state, config(root, notice_file=str(notice), notice_budget_s=1e-6))
    assert ckpt.save(1, kind="notice").committed
    notice.unlink()
    outcome = ckpt.save(2, kind="notice")
    ckpt.close()
    assert outcome.committed is False and "deadline" in outcome.message


def test_status_reports_replace_the_file_whole_and_are_rate_limited(tmp_path):
    path = tmp_path / "status.json"
    reporter = trainer.StatusReporter(str(path), min_interval_s=3600)
    assert reporter.report(10, 0.5, 100.0)
    assert not reporter.report(11, 0.4, 100.0)
    assert json.loads(path.read_text())["step"] == 10
    assert reporter.report(12, 0.3, 90.0, force=True)
    assert json.loads(path.read_text()) | {"time": 0} == {"step": 12, "loss": 0.3, "samples_per_s": 90.0, "time": 0}
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]


def test_without_the_status_variable_report_does_nothing(monkeypatch):
    monkeypatch.delenv(protocol.ENV_STATUS_FILE, raising=False)
    assert trainer.StatusReporter().report(1, 0.1, 1.0) is False


@pytest.mark.parametrize("field,value,message", [
    ("every_steps", 0, "every_steps=0 must be >= 1"),
    ("interval_s", -1, "interval_s=-1 must be > 0"),
    ("pace_fraction", 2, "pace_fraction=2 must be in"),
    ("write_live_fraction", 1.5, "write_live_fraction=1.5 must be in"),
    ("uri", "", "set RESPAWN_CHECKPOINT_URI"),
])
def test_bad_settings_are_refused_with_the_field_named(root, field, value, message):
    with pytest.raises(ConfigError, match=message):
        CheckpointConfig(**({"uri": root} | {field: value}))
