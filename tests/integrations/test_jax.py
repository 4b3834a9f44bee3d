"""JAX / Flax / optax with Orbax under respawn.integrations.jax (issue 18 item 5): real
processes, real signals, CPU JAX.

The example (agents/respawn/examples/jax_flax.py) is run uninterrupted, stopped by SIGTERM and
resumed, SIGKILLed while a save is being written and resumed: the resumed runs end
bitwise equal to the uninterrupted one (params, optimizer state, PRNG key) with the
same data position. The agent's validator process validates a JAX checkpoint with the
script's eval_fn. A torch checkpoint is refused with nothing deleted.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("orbax.checkpoint")

from respawn.checkpoint import CheckpointConfig, Checkpointer, TrainState, layout  # noqa: E402
from respawn.checkpoint.reader import ref_from_uri  # noqa: E402
from respawn.examples import jax_flax, tiny  # noqa: E402
from respawn.integrations.jax import load_checkpoint, restore_state  # noqa: E402

from .trials import ROOT, kill_mid_save, newest_committed, reference_run_finished, reports, run, start, wait_for  # noqa: E402

MODULE = "respawn.examples.jax_flax"
STEPS = 30
ARGS = ("--steps", str(STEPS), "--every-steps", "8")


def saved(uri, step: int) -> tuple[dict, dict]:
    """(the train state, state.json) of committed checkpoint `step`, digests verified."""
    loaded = load_checkpoint(ref_from_uri(f"{uri}/{layout.step_dir(step)}"))
    return restore_state(loaded, jax_flax.make_state()), loaded.meta


def assert_bitwise_equal(a: dict, b: dict) -> None:
    import jax

    leaves_a, tree_a = jax.tree.flatten_with_path(jax.tree.map(_raw, a))
    leaves_b, tree_b = jax.tree.flatten_with_path(jax.tree.map(_raw, b))
    assert tree_a == tree_b
    differ = [jax.tree_util.keystr(path) for (path, x), (_, y) in zip(leaves_a, leaves_b)
              if x.dtype != y.dtype or not np.array_equal(x, y)]
    assert differ == []


def _raw(leaf):
    import jax

    is_key = jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
    return np.asarray(jax.random.key_data(leaf) if is_key else leaf)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The uninterrupted run, with validation configured (reference loss at each save)."""
    uri = tmp_path_factory.mktemp("jax") / "uninterrupted"
    code, out = run(MODULE, uri, *ARGS, "--validate")
    assert code == 0, out
    return uri


def test_notice_saves_at_a_step_boundary_stops_and_resumes_bitwise(uninterrupted, tmp_path):
    uri, channel = tmp_path / "ckpt", tmp_path / "channel"
    proc = start(MODULE, uri, *ARGS, "--step-delay", "0.1", channel=channel)
    wait_for(lambda: newest_committed(uri), proc, "a first periodic commit", poll_s=0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert "finished" not in out
    notice = [r for r in reports(channel) if r["kind"] == "notice"]
    assert len(notice) == 1, reports(channel)
    stopped_at = notice[0]["step"]
    assert 8 <= stopped_at < STEPS
    assert json.loads((channel / "status.json").read_text())["stopped"] is True
    # Saved at a step boundary: the data position is the number of batches trained.
    _, meta = saved(uri, stopped_at)
    assert meta["framework"] == "jax" and meta["extra"] == {"position": stopped_at}
    assert "arrays" in meta  # the notice save's own raw file, not Orbax's format: the resume reads it
    code, out = run(MODULE, uri, *ARGS)
    assert code == 0, out
    assert f"resuming at step {stopped_at} from" in out
    resumed, meta = saved(uri, STEPS)
    expected, expected_meta = saved(uninterrupted, STEPS)
    assert_bitwise_equal(resumed, expected)  # params, optimizer state and PRNG key
    assert meta["extra"] == expected_meta["extra"] == {"position": STEPS}


def test_sigkill_mid_save_resumes_from_the_previous_commit(uninterrupted, tmp_path):
    uri = tmp_path / "ckpt"
    torn, previous = kill_mid_save(MODULE, uri, *ARGS, "--n-embd", "16", "--step-delay", "0.05")
    assert previous is not None and previous < torn
    code, out = run(MODULE, uri, *ARGS)
    assert code == 0, out
    assert f"resuming at step {previous} from" in out
    assert_bitwise_equal(saved(uri, STEPS)[0], saved(uninterrupted, STEPS)[0])


def test_the_validator_process_checks_a_jax_checkpoint_with_the_scripts_eval_fn(uninterrupted):
    uri = f"{uninterrupted}/{layout.step_dir(STEPS)}"
    assert saved(uninterrupted, STEPS)[1]["reference_loss"] > 0
    validate = [sys.executable, "-m", "respawn.checkpoint.validate", uri, "--no-record"]
    proc = subprocess.run(validate, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["result"] == "valid"
    # An eval_fn that raises: the check failed (`error`), the checkpoint is not condemned.
    proc = subprocess.run([*validate, "--model-factory", f"{MODULE}:make_state", "--batch-factory",
                           f"{MODULE}:validation_batch", "--eval-fn", f"{MODULE}:no_such_function"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    verdict = json.loads(proc.stdout.splitlines()[-1])
    assert proc.returncode == 2 and verdict["result"] == "error" and "no_such_function" in verdict["message"]


@pytest.mark.e2e  # four real training runs, then one more
def test_preflight_proves_the_jax_example_resumes(tmp_path):
    """`respawn-agent preflight --framework jax`: the four runs, the reference loss of every
    checkpoint compared, the checkpoints' framework checked."""
    proc = subprocess.run(
        [sys.executable, "-m", "respawn.agent", "preflight", "--steps", "60", "--checkpoint-interval-s", "0.2",
         "--notice-budget-s", "20", "--run-timeout-s", "200", "--framework", "jax", "--work-dir", str(tmp_path / "pf"),
         "--", sys.executable, "-m", MODULE, "--validate", "--step-delay", "0.02"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "same checkpoint reference loss at" in proc.stdout and "(jax checkpoints)" in proc.stdout
    # The same script checked as another kind fails, naming what wrote its checkpoints.
    proc = subprocess.run(
        [sys.executable, "-m", "respawn.agent", "preflight", "--steps", "40", "--checkpoint-interval-s", "0.3",
         "--framework", "torch", "--work-dir", str(tmp_path / "pf-torch"),
         "--", sys.executable, "-m", MODULE, "--step-delay", "0.5"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1 and "was written by 'jax', expected 'torch'" in proc.stdout, proc.stdout + proc.stderr
    assert not reference_run_finished(tmp_path / "pf-torch", 40)  # told at its first checkpoint


def test_the_reported_stall_has_what_the_steps_beside_a_periodic_save_lost(tmp_path):
    """Orbax's writer and the commit's digests run beside the loop's next steps; on a
    machine short of cores those steps take longer. The stall a periodic save reports (to
    the agent, the dashboard, the money) is what the loop saw: its blocking part and that
    after-effect, as the torch Checkpointer counts it. The steps here are made that much
    longer while the save is in flight."""
    from respawn.integrations.jax import SpotSafe

    reports = tmp_path / "checkpoints.jsonl"
    ckpt = SpotSafe(CheckpointConfig(uri=str(tmp_path / "ckpt"), every_steps=None, interval_s=3600,
                                     checkpoints_file=str(reports), handle_signals=False))
    state = jax_flax.make_state(512, 8)  # ~20 MB: a write and commit of some steps
    for step in range(1, 6):  # the loop's own step time, no save beside it
        time.sleep(0.01)
        ckpt.save(step, state)
    assert ckpt.save(6, state, kind="periodic")
    slower_by, step = 0.0, 6
    while not reports.exists() and step < 500:
        extra = 0.05
        time.sleep(0.01 + extra)
        step += 1
        ckpt.save(step, state)
        slower_by += extra if not reports.exists() else 0.0  # a step the commit ended in is not all beside it
    ckpt.close()
    [report] = [json.loads(line) for line in reports.read_text().splitlines()]
    assert report["step"] == 6 and report["kind"] == "periodic" and slower_by > 0
    assert report["stall_s"] >= 0.8 * slower_by, (report["stall_s"], slower_by)


def test_a_torch_checkpoint_is_refused_and_kept(tmp_path):
    uri = tmp_path / "ckpt"
    other = Checkpointer(TrainState(tiny.make_model()), CheckpointConfig(uri=str(uri), handle_signals=False))
    other.save(5, kind="final")
    other.close()
    before = sorted(p.relative_to(uri) for p in uri.rglob("*"))
    code, out = run(MODULE, uri, "--steps", "10")
    assert code != 0
    assert "was written by framework 'torch', not by the JAX integration" in out and "nothing was deleted" in out
    assert sorted(p.relative_to(uri) for p in uri.rglob("*")) == before


def test_the_agent_preflight_and_validator_import_no_jax():
    """jax is imported for a JAX checkpoint only, inside the validator process."""
    modules = ("jax", "flax", "optax", "orbax")
    probe = ("import sys, respawn.agent.__main__, respawn.agent.lifecycle, respawn.agent.preflight, respawn.checkpoint.validate, "
             f"respawn.integrations; print([m for m in {modules!r} if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stderr
