"""Accelerate's save_state/load_state under Respawn's protocol (SpotSafeState): real
processes, real signals, the example's small LM built from a config (issue 18).

The example is run uninterrupted with validation (a reference loss at every save), then
stopped by SIGTERM and resumed, and SIGKILLed mid-save and resumed, without: they end
bitwise equal, so the reference loss disturbs nothing. The validator process checks its
checkpoints with the factories; a resume skips one whose weights were altered; an eval_fn
that fails makes the verdict `error` and deletes nothing; a notice save past its deadline
commits nothing and says so; preflight proves the example resumes.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest
import torch
from safetensors.torch import load_file, save_file, save_model
from torch import nn

pytest.importorskip("accelerate")

from respawn.checkpoint import layout, manifest  # noqa: E402
from respawn.checkpoint.validation import has_meta_state, load_model_weights  # noqa: E402

from .trials import (ROOT, kill_mid_save, newest_committed, preflight, reference_run_finished, reports, run,  # noqa: E402
                     start, wait_for)

MODULE = "respawn.examples.accelerate_loop"
ARGS = ("--steps", "30", "--every-steps", "5")
# Bitwise equal after a resume; random_states_0.pkl is not compared: it holds the loader
# generator's state, which the resumed run's fresh iterator (skip_first_batches) advanced
# differently, and state.json names its own checkpoint id.
COMPARED = ("model.safetensors", "optimizer.bin", "scheduler.bin")
FACTORIES = {"RESPAWN_MODEL_FACTORY": "respawn.examples.tiny_lm:make_model",
             "RESPAWN_BATCH_FACTORY": "respawn.examples.tiny_lm:validation_batch"}
RAISES = "tests.checkpoint.factories:eval_fn_that_raises"
NAN = "tests.checkpoint.factories:eval_fn_that_gives_nan"


def digests(uri, step: int) -> dict:
    files = json.loads((uri / layout.step_dir(step) / layout.MANIFEST).read_text())["files"]
    return {name: files[name]["digest"] for name in COMPARED}


def tree(uri) -> list:
    return sorted(p.relative_to(uri) for p in uri.rglob("*"))


def validate(uri: str, *args: str) -> tuple[int, dict]:
    """The agent's validator process on checkpoint `uri`: its exit code and verdict."""
    done = subprocess.run([sys.executable, "-m", "respawn.checkpoint.validate", uri, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    return done.returncode, json.loads(done.stdout.splitlines()[-1])


def stop_after_a_commit(uri, channel, *args: str, keep_env: tuple[str, ...] = ()) -> int:
    """Run the example, SIGTERM it once a periodic save committed; the step it stopped at."""
    proc = start(MODULE, uri, *ARGS, *args, "--step-delay", "0.1", channel=channel, keep_env=keep_env)
    wait_for(lambda: newest_committed(uri), proc, "a first commit", poll_s=0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "finished" not in out, out
    assert json.loads((channel / "status.json").read_text())["stopped"] is True
    return json.loads((channel / "status.json").read_text())["step"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    uri = tmp_path_factory.mktemp("accelerate") / "uninterrupted"
    code, out = run(MODULE, uri, *ARGS, "--validate", channel=uri.parent / "channel")
    assert code == 0, out
    return uri


def test_notice_saves_stops_and_resumes_bitwise(uninterrupted, tmp_path):
    uri, channel = tmp_path / "ckpt", tmp_path / "channel"
    stopped_at = stop_after_a_commit(uri, channel)
    assert [r["step"] for r in reports(channel) if r["kind"] == "notice"] == [stopped_at]
    assert 5 <= stopped_at < 30
    code, out = run(MODULE, uri, *ARGS)
    assert code == 0, out
    assert f"resumed at step {stopped_at} from" in out
    assert digests(uri, 30) == digests(uninterrupted, 30)


def test_sigkill_mid_save_resumes_from_the_previous_commit(uninterrupted, tmp_path):
    uri = tmp_path / "ckpt"
    torn, previous = kill_mid_save(MODULE, uri, *ARGS, "--step-delay", "0.02")
    assert previous is not None and previous < torn
    code, out = run(MODULE, uri, *ARGS)
    assert code == 0, out
    assert f"resumed at step {previous} from" in out
    assert digests(uri, 30) == digests(uninterrupted, 30)


def test_the_validator_process_checks_an_accelerate_checkpoint(uninterrupted):
    saved = reports(uninterrupted.parent / "channel")
    assert [r["step"] for r in saved] == [5, 10, 15, 20, 25, 30]
    assert all(r["reference_loss"] > 1 for r in saved)  # recorded at every save, reported to the agent
    # finish() validated the final checkpoint and exported its weights.
    assert json.loads((uninterrupted / layout.step_dir(30) / layout.VALIDATION).read_text())["result"] == "valid"
    assert (uninterrupted / "export" / layout.step_dir(30) / "model.safetensors").is_file()
    uri, before = f"{uninterrupted}/{layout.step_dir(25)}", tree(uninterrupted)
    code, verdict = validate(uri, "--no-record")
    assert (code, verdict["result"]) == (0, "valid"), verdict
    assert verdict["loss"] == verdict["reference_loss"] == saved[-2]["reference_loss"]
    job = ("--no-record", "--model-factory", FACTORIES["RESPAWN_MODEL_FACTORY"],
           "--batch-factory", FACTORIES["RESPAWN_BATCH_FACTORY"])
    code, verdict = validate(uri, *job, f"--eval-fn={RAISES}")
    assert (code, verdict["result"]) == (2, "error") and "labels out of range" in verdict["message"], verdict
    code, verdict = validate(uri, *job, f"--eval-fn={NAN}")
    assert (code, verdict["result"]) == (2, "error") and "not a finite number" in verdict["message"], verdict
    code, verdict = validate(uri, "--no-record", "--model-factory", "respawn.examples.tiny:make_model",
                             "--batch-factory", "respawn.examples.tiny:validation_batch")
    assert (code, verdict["result"]) == (2, "error") and "does not fit the model" in verdict["message"], verdict
    assert tree(uninterrupted) == before


def tamper_and_reseal(ckpt) -> None:
    """Scale one weight matrix in model.safetensors and put the new digest in the
    manifest, as a buggy writer would: the digests pass, only validation can tell."""
    path = ckpt / "model.safetensors"
    weights = load_file(path)
    weights["head.weight"] *= 3
    save_file(weights, path, metadata={"format": "pt"})
    raw = path.read_bytes()
    body = json.loads((ckpt / layout.MANIFEST).read_text())
    body["files"][path.name] = {"size": len(raw), "digest": manifest.digest_bytes(raw)}
    (ckpt / layout.MANIFEST).write_text(json.dumps(body))


def test_a_resume_skips_a_checkpoint_that_fails_validation_and_still_ends_bitwise(uninterrupted, tmp_path):
    uri, channel = tmp_path / "ckpt", tmp_path / "channel"
    stopped_at = stop_after_a_commit(uri, channel, "--validate")
    notice = uri / layout.step_dir(stopped_at)
    assert json.loads((notice / layout.STATE).read_text())["reference_loss"] > 1
    tamper_and_reseal(notice)
    previous = max(r["step"] for r in reports(channel) if r["kind"] == "periodic")
    code, out = run(MODULE, uri, *ARGS, "--validate")
    assert code == 0, out
    assert f"skipping {notice}: failed validation" in out and f"resumed at step {previous} from" in out
    assert digests(uri, 30) == digests(uninterrupted, 30)


def test_an_eval_fn_that_fails_is_an_error_that_stops_the_resume_and_deletes_nothing(tmp_path, monkeypatch):
    for name, value in {**FACTORIES, "RESPAWN_EVAL_FN": RAISES}.items():
        monkeypatch.setenv(name, value)
    uri, channel = tmp_path / "ckpt", tmp_path / "channel"
    job = tuple(FACTORIES) + ("RESPAWN_EVAL_FN",)
    stopped_at = stop_after_a_commit(uri, channel, keep_env=job)
    # A failing eval_fn costs no checkpoint: every save committed, none with a reference loss.
    assert reports(channel) and all(r["reference_loss"] is None for r in reports(channel))
    uri_of = f"{uri}/{layout.step_dir(stopped_at)}"
    code, verdict = validate(uri_of, "--model-factory", FACTORIES["RESPAWN_MODEL_FACTORY"],
                             "--batch-factory", FACTORIES["RESPAWN_BATCH_FACTORY"], f"--eval-fn={RAISES}")
    assert (code, verdict["result"]) == (2, "error") and "at save" in verdict["message"], verdict
    before = tree(uri)
    code, out = run(MODULE, uri, *ARGS, keep_env=job)
    assert code != 0 and f"cannot validate {uri_of} to resume from it" in out and "labels out of range" in out, out
    assert tree(uri) == before


def test_a_notice_save_past_its_deadline_commits_nothing_and_says_so(uninterrupted, tmp_path, monkeypatch):
    notice_file = tmp_path / "notice.json"
    monkeypatch.setenv("RESPAWN_NOTICE_FILE", str(notice_file))
    uri, channel = tmp_path / "ckpt", tmp_path / "channel"
    proc = start(MODULE, uri, *ARGS, "--step-delay", "0.1", channel=channel, keep_env=("RESPAWN_NOTICE_FILE",))
    wait_for(lambda: newest_committed(uri), proc, "a first commit", poll_s=0.05)
    # The deadline the agent wrote has passed by the time the notice is seen.
    now = datetime.now(timezone.utc)
    notice_file.write_text(json.dumps({"source": "local", "notice_time": now.isoformat(),
                                       "deadline": (now - timedelta(seconds=1)).isoformat()}))
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    # A missed notice is no clean stop: the exit is not 0, its cause is the last line, and the
    # status file never says `stopped` (the agent reports the notice as missed).
    assert proc.returncode != 0, out
    assert json.loads((channel / "status.json").read_text()).get("stopped") is not True
    stopped_at = int(re.search(r"notice save of step (\d+) not committed", out).group(1))
    assert (f"notice save of step {stopped_at} not committed: PersistCancelled: save_state took" in out
            and "ended past the notice deadline" in out), out
    assert "NoticeSaveMissed" in out.strip().splitlines()[-1], out
    assert all(r["kind"] == "periodic" for r in reports(channel))
    assert not (uri / layout.step_dir(stopped_at)).exists()
    previous = newest_committed(uri)
    assert f"previous checkpoint {layout.step_dir(previous)} is intact" in out
    code, out = run(MODULE, uri, *ARGS)
    assert code == 0 and f"resumed at step {previous} from" in out, out
    assert digests(uri, 30) == digests(uninterrupted, 30)


def test_a_torch_checkpoint_is_refused_and_kept(tmp_path):
    uri = tmp_path / "ckpt"
    assert run("respawn.examples.tiny", uri, "--steps", "3")[0] == 0
    before = tree(uri)
    code, out = run(MODULE, uri, *ARGS)
    assert code != 0
    assert "was written by a PyTorch loop with Checkpointer (torch)" in out and "nothing was deleted" in out
    assert tree(uri) == before


def test_the_validators_reader_of_accelerate_checkpoints_imports_no_accelerate():
    probe = "import sys, respawn.integrations.accelerate; print('accelerate' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


class TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(64, 8)
        self.head = nn.Linear(8, 64, bias=False)
        self.head.weight = self.tokens.weight

    def forward(self, input_ids):
        return self.head(self.tokens(input_ids))


def test_a_tied_weight_stored_once_loads_under_each_of_its_names(tmp_path):
    """save_state writes model.safetensors without a tied tensor's other names (safetensors
    refuses shared tensors); validation's strict load must still fit the model."""
    torch.manual_seed(0)
    model = TiedLM()
    save_model(model, tmp_path / "model.safetensors")
    weights = load_file(tmp_path / "model.safetensors")
    assert len(weights) == 1
    with torch.device("meta"):
        skeleton = TiedLM()
    load_model_weights(skeleton, weights, "the file", assign=True)
    assert not has_meta_state(skeleton)
    ids = torch.arange(16).reshape(2, 8)
    assert torch.equal(skeleton(ids), model(ids))


@pytest.mark.e2e  # four real training runs, then one more
def test_preflight_proves_the_accelerate_example_resumes(tmp_path):
    """`respawn-agent preflight --framework accelerate`: every step's loss and every
    checkpoint's reference loss of the interrupted runs equal the uninterrupted run's; the
    same script checked as another framework fails, naming what wrote its checkpoints."""
    script = (sys.executable, "-m", MODULE, "--steps", "40")
    proc = preflight("accelerate", tmp_path / "pf", *script, "--validate", "--step-delay", "0.03")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "same loss at 40 compared step(s), up to step 40" in proc.stdout
    assert "same checkpoint reference loss at" in proc.stdout and "(accelerate checkpoints)" in proc.stdout
    proc = preflight("hf", tmp_path / "pf-other", *script, "--step-delay", "0.5")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "was written by 'accelerate', expected 'hf'" in proc.stdout
    assert not reference_run_finished(tmp_path / "pf-other", 40)  # told at its first checkpoint
