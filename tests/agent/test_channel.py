"""What the agent reads from the trainer: garbage is skipped, never fatal; output is bounded."""

from __future__ import annotations

import json

from respawn import protocol
from respawn.agent.channel import CheckpointsTail, LogTail, StatusReader, last_exception_line

GOOD = {"checkpoint_id": "5f0c7a8e-0000-4000-8000-000000000001", "step": 10, "uri": "/c/step-10", "bytes": 5, "manifest_digest": "xxh3_128:ab", "kind": "notice"}


def test_checkpoint_lines_are_reported_once_and_bad_lines_skipped(tmp_path, caplog):
    path = tmp_path / "checkpoints.jsonl"
    tail = CheckpointsTail(str(path))
    path.write_text("not json\n" + json.dumps({**GOOD, "step": "ten"}) + "\n" + json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "step": 20})[:30])
    reports = tail.new_reports()
    assert [(r.step, r.kind) for r in reports] == [(10, "notice")]
    assert "not json" in caplog.text and "'ten'" in caplog.text
    with open(path, "a") as f:  # the half-written line is completed: read once, now
        f.write(json.dumps({**GOOD, "step": 20})[30:] + "\n")
    assert [r.step for r in tail.new_reports()] == [20]
    assert tail.new_reports() == []


def test_a_checkpoints_tiers_reach_its_report_and_garbled_ones_never_lose_it(tmp_path, caplog):
    path = tmp_path / "checkpoints.jsonl"
    tail = CheckpointsTail(str(path))
    lines = [GOOD | {"tiers": ["storage", "memory"]}, GOOD | {"step": 20}, GOOD | {"step": 30, "tiers": ["memory"]},
             GOOD | {"step": 40, "tiers": "everywhere"}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    reports = tail.new_reports()
    assert [(r.step, r.tiers) for r in reports] == [(10, ["storage", "memory"]), (20, ["storage"]), (30, ["storage"]),
                                                    (40, ["storage"])]
    assert "tiers ['memory'] is not a list" in caplog.text and "reported as in storage only" in caplog.text


def test_status_garbage_keeps_the_last_good_status_and_nan_becomes_none(tmp_path):
    path = tmp_path / "status.json"
    reader = StatusReader(str(path))
    path.write_text('{"step": 7, "loss": NaN, "samples_per_s": 12.5}')
    beat = reader.heartbeat()
    assert (beat.step, beat.loss, beat.samples_per_s) == (7, None, 12.5)
    path.write_text("<html>")
    assert reader.heartbeat().step == 7
    path.write_text('{"step": true, "loss": "low"}')
    assert (reader.heartbeat().step, reader.heartbeat().loss) == (0, None)


def test_logs_ship_in_bounded_batches_with_contiguous_offsets(tmp_path):
    path = tmp_path / "out.log"
    n = protocol.MAX_LOG_LINES_PER_BATCH + 5
    path.write_text("".join(f"line {i}\n" for i in range(n)) + "x" * (protocol.MAX_LOG_LINE_CHARS + 10) + "\npartial")
    tail = LogTail(str(path))
    batches = tail.batches()
    assert [(b.offset, len(b.lines)) for b in batches] == [(0, protocol.MAX_LOG_LINES_PER_BATCH), (protocol.MAX_LOG_LINES_PER_BATCH, 6)]
    assert len(batches[1].lines[-1]) == protocol.MAX_LOG_LINE_CHARS
    assert tail.batches() == []
    assert [(b.offset, b.lines) for b in tail.batches(final=True)] == [(n + 1, ["partial"])]


def test_the_last_exception_line_of_a_traceback():
    tail = "step 1\nTraceback (most recent call last):\n  File \"t.py\", line 3, in <module>\n    f()\nRuntimeError: CUDA out of memory\nbye\n"
    assert last_exception_line(tail) == "RuntimeError: CUDA out of memory"
    assert last_exception_line("all good\n") == ""


def test_heartbeat_checkpoint_stats_fall_back_to_the_last_commit(tmp_path):
    path = tmp_path / "status.json"
    path.write_text('{"step": 12, "loss": 0.3}')
    last = protocol.CheckpointReport(checkpoint_id="c", step=10, uri="/c", bytes=1, manifest_digest="x", save_s=1.5, stall_s=0.01)
    beat = StatusReader(str(path)).heartbeat(last)
    assert (beat.last_checkpoint_step, beat.checkpoint_save_s, beat.checkpoint_stall_s) == (10, 1.5, 0.01)


def test_a_memory_resume_the_trainer_reports_stays_in_every_status_after_and_reaches_the_heartbeat(tmp_path):
    from respawn.trainer import StatusReporter

    path = tmp_path / "status.json"
    reporter, reader = StatusReporter(str(path), min_interval_s=0), StatusReader(str(path))
    reporter.report(3)
    assert reader.heartbeat().memory_resume_step is None
    reporter.lasting["memory_resume_step"] = 45  # what trainer.resumed_from_memory sets
    for step in (45, 46, 47):  # the agent may read only the last of several writes
        reporter.report(step, 0.5)
    beat = reader.heartbeat()
    assert (beat.step, beat.memory_resume_step) == (47, 45)


def test_a_restarted_trainer_starts_with_nothing_the_stopped_one_said(tmp_path):
    path = tmp_path / "status.json"
    reader = StatusReader(str(path))
    path.write_text('{"step": 47, "memory_resume_step": 45}')
    assert reader.heartbeat().step == 47
    reader.restart(40)  # a regroup: the new trainer resumes at 40 and has written nothing yet
    beat = reader.heartbeat()
    assert (beat.step, beat.memory_resume_step) == (40, None) and not path.exists()
