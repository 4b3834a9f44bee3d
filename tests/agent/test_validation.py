"""Committed checkpoints are validated one at a time, at low priority, newest first."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from respawn import protocol
from respawn.agent.validation import DEFAULT_COMMAND, Validator

FAKE = Path(__file__).parent / "scripts" / "fake_validate.py"
ROOT = Path(__file__).resolve().parents[2]


def checkpoint(step: int, uri: str) -> protocol.CheckpointReport:
    return protocol.CheckpointReport(checkpoint_id=f"id-{step}", step=step, uri=uri, bytes=1, manifest_digest="x")


def run(*reports, wait_for: int, command: str = f"{sys.executable} {FAKE} {{uri}}",
        spec: protocol.ValidationSpec = protocol.ValidationSpec(), cwd: str | None = None):
    results = []
    validator = Validator(command=command, spec=spec, env=dict(os.environ), cwd=cwd, on_result=lambda cid, r: results.append((cid, r)))
    for report in reports:
        validator.submit(report)
    end = time.monotonic() + 60
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
