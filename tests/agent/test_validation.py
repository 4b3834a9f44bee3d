"""Committed checkpoints are validated one at a time, at low priority, newest first, by a
validator kept warm; one that dies or hangs never holds validation up."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from respawn import protocol
from respawn.agent.validation import DEFAULT_COMMAND, SERVE_COMMAND, Validator

FAKE = Path(__file__).parent / "scripts" / "fake_validate.py"
FAKE_SERVE = Path(__file__).parent / "scripts" / "fake_validate_serve.py"
ROOT = Path(__file__).resolve().parents[2]


def checkpoint(step: int, uri: str) -> protocol.CheckpointReport:
    return protocol.CheckpointReport(checkpoint_id=f"id-{step}", step=step, uri=uri, bytes=1, manifest_digest="x")


def run(*reports, wait_for: int, command: str = f"{sys.executable} {FAKE} {{uri}}",
        spec: protocol.ValidationSpec = protocol.ValidationSpec(), cwd: str | None = None, serve_command: str = "",
        timeout_s: float = 60, one_at_a_time: bool = False):
    results = []
    validator = Validator(command=command, spec=spec, env=dict(os.environ), cwd=cwd, serve_command=serve_command,
                          timeout_s=timeout_s, on_result=lambda cid, r: results.append((cid, r)))
    end = time.monotonic() + 120
    for count, report in enumerate(reports, 1):
        validator.submit(report)
        while one_at_a_time and len(results) < count and time.monotonic() < end:
            validator.poll()
            time.sleep(0.02)
    while len(results) < wait_for and time.monotonic() < end:
        validator.poll()
        time.sleep(0.02)
    validator.stop()
    return results


def test_a_verdict_is_reported_from_a_niced_process():
    [(cid, report)] = run(checkpoint(1, "/c/step-1"), wait_for=1)
    assert (cid, report.result, report.message) == ("id-1", "valid", "nice=19")


def test_only_the_newest_waiting_checkpoint_is_validated():
    results = run(checkpoint(1, "/c/step-1"), checkpoint(2, "/c/bad-2"), checkpoint(3, "/c/bad-3"), wait_for=2)
    assert [(cid, r.result) for cid, r in results] == [("id-1", "valid"), ("id-3", "invalid")]


def test_an_unreadable_superseded_checkpoint_is_not_called_invalid_and_a_crash_on_the_newest_is_an_error():
    results = run(checkpoint(1, "/c/gone-1"), checkpoint(2, "/c/crash-2"), wait_for=1)
    assert [(cid, r.result) for cid, r in results] == [("id-2", "error")]  # the check failed, not the checkpoint
    assert "segfault-ish" in results[0][1].message


def test_a_failed_check_is_reported_as_an_error_with_its_cause():
    [(cid, report)] = run(checkpoint(1, "/c/broken-1"), wait_for=1)
    assert (cid, report.result, report.message) == ("id-1", "error", "eval_fn 'm:f' raised ValueError: boom")


def test_the_real_validator_reports_the_jobs_failing_eval_fn_as_an_error_naming_it(tmp_path):
    """The agent's own command line (DEFAULT_COMMAND, the job's eval_fn filled in) against
    a real checkpoint: the exception line reaches the report."""
    from respawn.checkpoint import CheckpointConfig, Checkpointer
    from respawn.examples import tiny

    root = str(tmp_path / "ckpt")
    state = tiny.build()
    ckpt = Checkpointer(state, CheckpointConfig(uri=root, every_steps=1, handle_signals=False, validation=tiny.VALIDATION))
    x, y = tiny.dataset()
    tiny.train_step(state, x, y)
    ckpt.save(1)
    ckpt.close()
    spec = protocol.ValidationSpec(model_factory=tiny.VALIDATION.model_factory, batch_factory=tiny.VALIDATION.batch_factory)
    [(_, good)] = run(checkpoint(1, f"{root}/step-00000001"), wait_for=1, command=DEFAULT_COMMAND, spec=spec, cwd=str(ROOT))
    assert good.result == "valid", good.message
    spec.eval_fn = "tests.checkpoint.factories:eval_fn_that_raises"
    [(_, bad)] = run(checkpoint(1, f"{root}/step-00000001"), wait_for=1, command=DEFAULT_COMMAND, spec=spec, cwd=str(ROOT))
    assert bad.result == "error"
    assert "ValueError: labels out of range for this vocabulary" in bad.message


FAKE_WARM = f"{sys.executable} {FAKE_SERVE}"


def test_the_warm_validator_answers_at_low_priority_and_one_that_dies_in_a_check_is_replaced_by_a_fresh_process():
    results = run(checkpoint(1, "/c/step-1"), checkpoint(2, "/c/warmdies-2"), checkpoint(3, "/c/bad-3"), wait_for=3,
                  serve_command=FAKE_WARM, one_at_a_time=True)
    assert [(cid, r.result, r.message) for cid, r in results] == [
        ("id-1", "valid", "warm nice=19"),
        ("id-2", "valid", "nice=19"),  # the one-shot command checked it
        ("id-3", "invalid", "warm nice=19"),  # and a warm validator is back for the next
    ]


def test_a_hung_validator_is_killed_and_reported_as_an_error_and_the_next_checkpoint_still_validates():
    results = run(checkpoint(1, "/c/hang-1"), checkpoint(2, "/c/step-2"), wait_for=2, serve_command=FAKE_WARM,
                  timeout_s=2, one_at_a_time=True)
    assert [(cid, r.result) for cid, r in results] == [("id-1", "error"), ("id-2", "valid")]
    assert "no verdict within 2s" in results[0][1].message and results[1][1].message == "warm nice=19"
    hung_one_shot = run(checkpoint(1, "/c/hang-1"), wait_for=1, timeout_s=2)
    assert [(cid, r.result) for cid, r in hung_one_shot] == [("id-1", "error")]


def test_the_warm_validator_gives_the_one_shot_verdicts_on_good_and_corrupt_checkpoints_and_leaves_no_temp_files(tmp_path):
    """The real validator both ways, on the same checkpoints: the same verdicts, each
    recorded in VALIDATION.json with nothing half-written beside it."""
    from respawn.checkpoint import CheckpointConfig, Checkpointer
    from respawn.examples import tiny

    root = tmp_path / "ckpt"
    state = tiny.build()
    ckpt = Checkpointer(state, CheckpointConfig(uri=str(root), every_steps=1, handle_signals=False, keep=3, validation=tiny.VALIDATION))
    x, y = tiny.dataset()
    for step in (1, 2):
        tiny.train_step(state, x, y)
        ckpt.save(step)
    ckpt.close()
    weights = next(p for p in (root / "step-00000002").iterdir() if p.name not in ("MANIFEST.json", "state.json") and p.stat().st_size > 1000)
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    spec = protocol.ValidationSpec(model_factory=tiny.VALIDATION.model_factory, batch_factory=tiny.VALIDATION.batch_factory)
    reports = [checkpoint(1, f"{root}/step-00000001"), checkpoint(2, f"{root}/step-00000002")]
    verdicts = {}
    for how, serve in (("one-shot", ""), ("warm", SERVE_COMMAND)):
        results = run(*reports, wait_for=2, command=DEFAULT_COMMAND, spec=spec, cwd=str(ROOT), serve_command=serve, one_at_a_time=True)
        verdicts[how] = [(cid, r.result, r.loss, r.message) for cid, r in results]
        assert not [p for p in root.rglob("*") if ".tmp" in p.name], how
    assert verdicts["warm"] == verdicts["one-shot"]
    assert [v[:2] for v in verdicts["warm"]] == [("id-1", "valid"), ("id-2", "invalid")]
    assert "digest" in verdicts["warm"][1][3], verdicts["warm"][1][3]
    assert json.loads((root / "step-00000001" / "VALIDATION.json").read_text())["result"] == "valid"
