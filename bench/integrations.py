"""What the framework integrations cost (agents/respawn/integrations), one row per framework.

    python bench/integrations.py [--check] [--frameworks hf,lightning] [--n-embd 512] [--steps 40] [--every 8]
                                 [--trials 5] [--no-validation]

Each framework trains a small causal LM (one block of width --n-embd, AdamW: weights +
two moments) in this process with its one line (`spot_safe(trainer)`) and Respawn's
periodic saves every --every steps, and:

1. periodic save stall: training time a periodic save of our integration takes from
   training, divided by the framework's own save of the same state.
   HF and Lightning: each save's `stall_s`, as reported to the agent (the snapshot, any
   wait of the next optimizer step for it, and what the steps beside its persist lost
   against the step time before it), mean over the run's saves, against Trainer's
   `_save_checkpoint` and Lightning's `save_checkpoint`, synchronous, the median of three
   made at step 2, before any of ours runs beside it (--check: <= 0.25).
   JAX: the part of a save that blocks the step, against Orbax's own `AsyncCheckpointer`
   save's (--check: <= 1), paired: at every second step the loop saves through both,
   one right after the other from the same state with the same Orbax options, which
   first alternating, neither with a save of its own still in flight (ours skips a save
   then; the loop waits for both, and for the page cache's writeback, untimed); the
   median of the pairs' ratios. (The stall a JAX save reports, its blocking part plus
   its after-effect, is tested in tests/integrations/test_jax.py: here the untimed waits
   would be counted in it.)
   The default width, 1024, makes a state of 100-150 MB (weights and AdamW's two
   moments; 88 MB for JAX's MLP).
2. notice -> committed: a real SIGTERM near the end; the notice save's `save_s` (its
   snapshot, write and commit, as reported) divided by a raw sequential write + fsync
   of the same number of bytes in the same directory (bench/notice.py's, the median of
   three). --check: <= 1.5.

3. validation of a causal-LM checkpoint: the validator's own code
   (`respawn.checkpoint.validate.main`, called in this process: read and verify the
   checkpoint, build the model from its factory, load the weights, score the batch with
   the default shifted cross-entropy) divided by one training step of the same model
   (tiny_lm's TinyGPT, one block of width --n-embd) on the same batch (forward,
   backward, AdamW step); medians of three after a warm-up. The validator's process
   start (a Python and torch import, a second or so) is not counted: the agent pays it
   beside training, not per step. --check: <= 3.

Each framework's trial runs --trials times (a fresh checkpoint root each); each ratio
printed, and checked, is the median over the trials, with their range beside it: a
notice save of a few tens of MB takes tens of milliseconds, where one run's figure
moves by 2-3x with what else the machine does.

A framework is one entry in FRAMEWORKS: a function that runs the trial and returns
the saves as its loop met them, the framework's own and, where it timed them, ours; the
reports file gives the rest. JAX trains a Flax MLP of eight
--n-embd wide layers (agents/respawn/examples/jax_flax.py) with its saves through Orbax.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from notice import raw_write_s  # noqa: E402

from respawn.checkpoint import CheckpointConfig  # noqa: E402

MAX_STALL_RATIO = {"hf": 0.25, "lightning": 0.25, "jax": 1.0}
OWN_SAVE = {"hf": "own sync save", "lightning": "own sync save", "jax": "Orbax's async save (blocking part)"}
MAX_NOTICE_RATIO = 1.5
MAX_VALIDATION_RATIO = 3.0
LM_WIDTH_ENV = "BENCH_LM_N_EMBD"  # read by bench_lm, which the validator builds by name
OWN_SAVE_STEP = 2


def timed(save: Callable[[], None]) -> float:
    started = time.perf_counter()
    save()
    return time.perf_counter() - started


def timed_thrice(save: Callable[[], None]) -> list[float]:
    return [timed(save) for _ in range(3)]


def hf_trial(work: Path, config: CheckpointConfig, n_embd: int, steps: int) -> tuple[list[float], None]:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from respawn.examples.hf_trainer import Tokens, make_model
    from respawn.integrations.hf import spot_safe

    own: list[float] = []

    class Bench(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == OWN_SAVE_STEP:
                own.extend(timed_thrice(lambda: trainer._save_checkpoint(trainer.model, None)))
            if state.global_step == steps - 2:
                os.kill(os.getpid(), signal.SIGTERM)

    args = TrainingArguments(output_dir=str(work / "own"), max_steps=steps, per_device_train_batch_size=8,
                             save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, logging_steps=10**6)
    trainer = Trainer(model=make_model(n_embd), args=args, train_dataset=Tokens(), callbacks=[Bench()])
    spot_safe(trainer, config, exit_on_stop=False)
    trainer.train()
    return own, None


def lightning_trial(work: Path, config: CheckpointConfig, n_embd: int, steps: int) -> tuple[list[float], None]:
    import lightning as L

    from respawn.checkpoint import ResumableLoader
    from respawn.examples import tiny_lm
    from respawn.examples.lightning_module import LitLM
    from respawn.integrations.lightning import spot_safe

    own: list[float] = []

    class Bench(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == OWN_SAVE_STEP:
                own.extend(timed_thrice(lambda: trainer.save_checkpoint(work / "own.ckpt")))
            if trainer.global_step == steps - 2:
                os.kill(os.getpid(), signal.SIGTERM)

    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(work),
                        callbacks=[Bench()])
    spot_safe(trainer, config, exit_on_stop=False)
    loader = ResumableLoader(tiny_lm.tokens(4096, seed=1), batch_size=8, seed=0, shuffle=True)
    try:
        trainer.fit(LitLM(n_embd), loader)
    except SystemExit:  # Lightning's own end of a run on SIGTERM (SIGTERMException)
        pass
    return own, None


def jax_trial(work: Path, config: CheckpointConfig, n_embd: int, steps: int) -> tuple[list[float], list[float]]:
    """At every second step the loop saves through both SpotSafe (a periodic save) and
    Orbax's own `AsyncCheckpointer`, one right after the other from the same state with
    the same Orbax options, which one first alternating: a pair meets the same step, page
    cache and neighbours, and differs by what our save adds to Orbax's. Each is timed as
    the loop waits for it, with neither's earlier save still in flight (ours skips a save
    then; the loop waits for both, untimed). A notice near the end."""
    import jax
    import orbax.checkpoint as ocp

    from respawn.examples import jax_flax
    from respawn.integrations.jax import SpotSafe

    layers = 8
    state, train_step = jax_flax.make_state(n_embd, layers), jax_flax.make_train_step(n_embd, layers)
    own: list[float] = []
    ours: list[float] = []
    ckpt = SpotSafe(config)
    with ocp.AsyncCheckpointer(ocp.StandardCheckpointHandler()) as orbax:
        def orbax_save():
            orbax.save(work / "own" / str(step), args=ocp.args.StandardSave(state))

        def our_save():
            if not ckpt.save(step, state, extra={"position": step}, kind="periodic"):
                raise SystemExit(f"jax: SpotSafe did not save at step {step}, with nothing in flight")

        for step in range(1, steps + 1):
            state, loss = train_step(state, *jax_flax.batch_at(step))
            jax.block_until_ready(loss)  # a step's time is its own, not the next one's
            if step == steps - 2:
                os.kill(os.getpid(), signal.SIGTERM)  # the notice row's save, at this step boundary
            if step % 2 or step == steps - 2:
                ckpt.save(step, state, extra={"position": step})
            else:
                pair = [(ours, our_save), (own, orbax_save)]  # ours first at the first: a process's first save is slow
                for times, save in pair if step % 4 else reversed(pair):
                    orbax.wait_until_finished()
                    ckpt.wait()
                    os.sync()  # Orbax does not fsync: its writeback would fall on the next save, or the notice
                    times.append(timed(save))
            if ckpt.should_stop:
                break
    ckpt.close()
    return own, ours


def bench_lm():
    """The validation row's model factory (`integrations:bench_lm`; bench/ is on sys.path)."""
    from respawn.examples import tiny_lm

    return tiny_lm.TinyGPT(tiny_lm.Config(n_embd=int(os.environ[LM_WIDTH_ENV]), n_head=8))


def measure_validation(n_embd: int) -> tuple[float, str]:
    """Validation of a causal-LM checkpoint / one training step of it (see item 3 above)."""
    import contextlib
    import io

    import torch

    from respawn.checkpoint import Checkpointer, TrainState, ValidationSettings
    from respawn.checkpoint.validate import main as validate
    from respawn.examples import tiny_lm

    os.environ[LM_WIDTH_ENV] = str(n_embd)
    model = bench_lm()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = tiny_lm.validation_batch()["input_ids"]  # the batch the validator scores

    def train_step():
        tiny_lm.shifted_cross_entropy(model(ids), ids).backward()
        optimizer.step()
        optimizer.zero_grad()

    def validate_once():
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = validate([uri, "--device", "cpu", "--no-record"])
        if code != 0:
            raise SystemExit(f"validation: the validator said {out.getvalue().strip()}")

    with tempfile.TemporaryDirectory(prefix="bench-validation-", dir=os.environ.get("BENCH_DIR")) as tmp:
        settings = ValidationSettings(f"{Path(__file__).stem}:bench_lm", "respawn.examples.tiny_lm:validation_batch")
        train_step()  # the optimizer's moments exist, as in any checkpoint after step 1
        ckpt = Checkpointer(TrainState(model, optimizer), CheckpointConfig(uri=tmp, validation=settings, handle_signals=False))
        uri = ckpt.save(1, kind="final").uri
        ckpt.close()
        train_step(), validate_once()  # warm-ups: first-call allocations and imports
        step_s = statistics.median(timed_thrice(train_step))
        validation_s = statistics.median(timed_thrice(validate_once))
    params = sum(p.numel() for p in model.parameters())
    detail = (f"TinyGPT width {n_embd}, {params / 1e6:.1f} M parameters, batch {tuple(ids.shape)}; validation "
              f"{validation_s * 1e3:.1f} ms / training step {step_s * 1e3:.1f} ms")
    return validation_s / step_s, detail


# A trial's save times, the framework's own and ours (None: the reports' stall_s gives ours).
FRAMEWORKS: dict[str, Callable[[Path, CheckpointConfig, int, int], tuple[list[float], list[float] | None]]] = {
    "hf": hf_trial,
    "lightning": lightning_trial,
    "jax": jax_trial,
}


def measure(name: str, n_embd: int, steps: int, every: int) -> tuple[float, float, str]:
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-", dir=os.environ.get("BENCH_DIR")) as tmp:
        work = Path(tmp)
        reports = work / "checkpoints.jsonl"
        config = CheckpointConfig(uri=str(work / "ckpt"), every_steps=every, checkpoints_file=str(reports))
        own, ours = FRAMEWORKS[name](work, config, n_embd, steps)
        rows = [json.loads(line) for line in reports.read_text().splitlines()]
        stalls = [r["stall_s"] for r in rows if r["kind"] == "periodic"]
        notice = [r for r in rows if r["kind"] == "notice"]
        if not stalls or len(notice) != 1:
            raise SystemExit(f"{name}: expected periodic saves and one notice save, got {[r['kind'] for r in rows]}")
        raw = statistics.median(raw_write_s(work, notice[0]["bytes"]) for _ in range(3))
    own_s, stall_s = statistics.median(own), statistics.mean(stalls)
    if ours is None:  # the reported stall against a synchronous save, which leaves nothing behind
        stall_ratio = stall_s / own_s
        stall = f"periodic stall {stall_s * 1e3:.1f} ms mean of {len(stalls)} / {OWN_SAVE[name]} {own_s * 1e3:.1f} ms"
    else:  # blocking parts, paired: each of ours against the framework's save at the same step
        stall_ratio = statistics.median(o / w for o, w in zip(ours, own))
        stall = (f"periodic save blocks {statistics.median(ours) * 1e3:.1f} ms / {OWN_SAVE[name]} {own_s * 1e3:.1f} ms, "
                 f"medians of {len(ours)} pairs")
    notice_ratio = notice[0]["save_s"] / raw
    detail = (f"{notice[0]['bytes'] / 1e6:.0f} MB state; {stall}; notice save {notice[0]['save_s'] * 1e3:.0f} ms "
              f"/ raw write+fsync {raw * 1e3:.0f} ms")
    return stall_ratio, notice_ratio, detail


def spread(ratios) -> str:
    ratios = sorted(ratios)
    return f"(range {ratios[0]:.3g}-{ratios[-1]:.3g})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a ratio is over its bound")
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--n-embd", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=8)
    parser.add_argument("--trials", type=int, default=5, help="trials per framework; the ratios are their medians")
    parser.add_argument("--no-validation", action="store_true", help="skip the causal-LM validation row")
    parser.add_argument("--smoke", action="store_true",
                        help="width 32, 16 steps, one trial: the suite's run that keeps the bench working")
    args = parser.parse_args(argv)
    if args.smoke:
        # Three periodic saves before the notice: under load the last may still be persisting
        # when the notice supersedes it, and the rows need one that committed.
        args.n_embd, args.steps, args.every, args.trials = 32, 16, 4, 1
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    import torch

    torch.set_num_threads(1)
    ok = True
    for name in filter(None, args.frameworks.split(",")):  # --frameworks "": the validation row only
        trials = [measure(name, args.n_embd, args.steps, args.every) for _ in range(args.trials)]
        stall, notice = (statistics.median(t[i] for t in trials) for i in (0, 1))
        detail = trials[len(trials) // 2][2]
        print(f"{name}: periodic save stall / {OWN_SAVE[name]} {stall:.3f} {spread(t[0] for t in trials)} "
              f"(bound {MAX_STALL_RATIO[name]}); notice -> committed / raw write {notice:.2f} "
              f"{spread(t[1] for t in trials)} (bound {MAX_NOTICE_RATIO}); median of {len(trials)} trials "
              f"[one trial: {detail}]", flush=True)
        ok = ok and stall <= MAX_STALL_RATIO[name] and notice <= MAX_NOTICE_RATIO
    if not args.no_validation:
        ratio, detail = measure_validation(args.n_embd)
        print(f"validation of a causal-LM checkpoint / one training step {ratio:.2f} (bound {MAX_VALIDATION_RATIO}) "
              f"[{detail}]", flush=True)
        ok = ok and ratio <= MAX_VALIDATION_RATIO
    if args.check and not ok:
        print("FAIL: a ratio is over its bound", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
