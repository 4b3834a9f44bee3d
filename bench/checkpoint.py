"""Checkpoint performance: each figure as a ratio to a baseline measured in the same run, same disk.

    .venv/bin/python bench/checkpoint.py                 # 0.25 GiB of model + Adam state, a few minutes
    .venv/bin/python bench/checkpoint.py --size-gib 1    # the issue's size
    .venv/bin/python bench/checkpoint.py --check         # exit 1 when a ratio misses its target

The state is an MLP of 2048-wide layers plus its Adam moments; the validation
batch is one training batch. Memory is measured in fresh subprocesses (peak RSS
never goes down, so a baseline and a candidate must not share a process).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from respawn.checkpoint import CheckpointConfig, Checkpointer, TrainState, ValidationSettings  # noqa: E402
from respawn.checkpoint import layout  # noqa: E402
from respawn.checkpoint.reader import CheckpointRef, load  # noqa: E402
from respawn.checkpoint.storage.local import LocalStorage  # noqa: E402
from respawn.checkpoint.validation import validate_loaded  # noqa: E402

WIDTH = 2048
BATCH = 64
SEED = 0


def layers_for(size_gib: float) -> int:
    per_layer = (WIDTH * WIDTH + WIDTH) * 4 * 3  # weights + two Adam moments, float32
    return max(1, round(size_gib * (1 << 30) / per_layer))


def make_model() -> nn.Module:
    """Validation factory: the bench's model (layer count from BENCH_LAYERS)."""
    layers = int(os.environ["BENCH_LAYERS"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        blocks = []
        for _ in range(layers):
            blocks += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
        return nn.Sequential(*blocks[:-1])


def validation_batch():
    g = torch.Generator().manual_seed(SEED)
    return torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)


VALIDATION = ValidationSettings("bench.checkpoint:make_model", "bench.checkpoint:validation_batch", tolerance=1e-4)


def build_state() -> TrainState:
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    state = TrainState(model, optimizer)
    train_step(state)  # Adam's moments exist from the first step on
    return state


def train_step(state: TrainState) -> None:
    x, y = validation_batch()
    state.optimizer.zero_grad(set_to_none=True)
    nn.functional.mse_loss(state.model(x), y).backward()
    state.optimizer.step()


def state_bytes(state: TrainState) -> int:
    total = sum(p.numel() * p.element_size() for p in state.model.parameters())
    for s in state.optimizer.state.values():
        total += sum(t.numel() * t.element_size() for t in s.values() if isinstance(t, torch.Tensor))
    return total


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def drop(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


# --- baselines --------------------------------------------------------------------------
def torch_save_fsync(state: TrainState, path: str) -> float:
    def save():
        with open(path, "wb") as f:
            torch.save({"model": state.model.state_dict(), "optimizer": state.optimizer.state_dict()}, f)
            f.flush()
            os.fsync(f.fileno())

    seconds = timed(save)
    os.remove(path)
    return seconds


def dcp_async_blocking(state: TrainState, workdir: str) -> float:
    """Blocking part of torch.distributed.checkpoint.async_save (default options), warm (second) save."""
    import torch.distributed.checkpoint as dcp

    blocked = []
    for i in range(2):
        sd = {"model": state.model.state_dict(), "optimizer": state.optimizer.state_dict()}
        start = time.perf_counter()
        future = dcp.async_save(sd, checkpoint_id=f"{workdir}/dcp-{i}")
        blocked.append(time.perf_counter() - start)
        future.result()
        drop(f"{workdir}/dcp-{i}")
    return blocked[-1]


def raw_write_bandwidth(nbytes: int, path: str) -> float:
    """Bytes/s of one sequential write of `nbytes` with fdatasync (64 MiB chunks)."""
    chunk = memoryview(bytearray(os.urandom(1 << 20)) * 64)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    start = time.perf_counter()
    left = nbytes
    while left > 0:
        left -= os.write(fd, chunk[: min(len(chunk), left)])
    os.fdatasync(fd)
    seconds = time.perf_counter() - start
    os.close(fd)
    os.remove(path)
    return nbytes / seconds


# --- candidates ---------------------------------------------------------------------------
def periodic_stall(state: TrainState, uri: str) -> float:
    """Time training is blocked by a periodic save, warm (second) save: in save() and,
    for the weights and moments copied beside the next step, in that step's optimizer
    step waiting for the copy (the Checkpointer adds that wait to the outcome)."""
    ckpt = Checkpointer(state, CheckpointConfig(uri=uri, interval_s=3600, validation=VALIDATION, handle_signals=False))
    stalls = []
    for step in (1, 2):
        outcome = ckpt.save(step, kind="periodic")
        train_step(state)
        stalls.append(outcome.stall_s)
        ckpt.wait()
    ckpt.close()
    drop(uri)
    return stalls[-1]


def steps_per_s(state: TrainState, seconds: float) -> float:
    start, steps = time.perf_counter(), 0
    while time.perf_counter() - start < seconds or steps < 3:
        train_step(state)
        steps += 1
    return steps / (time.perf_counter() - start)


def speed_during_persist(state: TrainState, uri: str, interval_s: float, repeats: int) -> tuple[float, float, float]:
    """Steps/s over each whole paced periodic persist against steps/s without checkpointing
    over as long right before and right after it (so a drift in the VM's speed hits both
    sides alike; one round's after is the next one's before): the median of those
    per-window ratios, the median training time lost per save (seconds), and the longest
    persist as a fraction of the interval. A first save, not counted, allocates the
    snapshot buffers, as in any run's first minutes."""
    ckpt = Checkpointer(state, CheckpointConfig(uri=uri, interval_s=interval_s, validation=VALIDATION, handle_signals=False))
    ckpt.save(1, kind="periodic")
    ckpt.wait()
    before = steps_per_s(state, ckpt.config.pace_fraction * interval_s)
    ratios, lost, persist_fraction = [], [], 0.0
    for step in range(2, repeats + 2):
        outcome = ckpt.save(step, kind="periodic")
        start, steps = time.perf_counter(), 0
        while outcome.committed is None:
            train_step(state)
            steps += 1
        window = time.perf_counter() - start
        persist_fraction = max(persist_fraction, (outcome.save_s or 0) / interval_s)
        after = steps_per_s(state, window)
        baseline = (before + after) / 2
        ratios.append(steps / window / baseline)
        lost.append(window - steps / baseline)
        before = after
    ckpt.close()
    drop(uri)
    return statistics.median(ratios), statistics.median(lost), persist_fraction


def notice_save(state: TrainState, uri: str, nbytes: int, validation: ValidationSettings | None = VALIDATION) -> tuple[float, float]:
    """(persist throughput in bytes/s, notice-to-durable seconds), warm buffers."""
    ckpt = Checkpointer(state, CheckpointConfig(uri=uri, interval_s=3600, validation=validation, handle_signals=False))
    ckpt.save(1, kind="notice")
    drop(f"{uri}/{layout.step_dir(1)}")
    start = time.perf_counter()
    outcome = ckpt.save(2, kind="notice")
    total = time.perf_counter() - start
    ckpt.close()
    assert outcome.committed, outcome.message
    throughput = nbytes / (total - outcome.stall_s)
    drop(uri)
    return throughput, total


def notice_rounds(state: TrainState, workdir: str, nbytes: int, rounds: int,
                  validation: ValidationSettings | None = VALIDATION) -> tuple[float, float, float]:
    """Raw write+fdatasync and a notice save back to back, `rounds` times: the medians of
    the per-round ratios (throughput, notice-to-durable) and of the raw bandwidth. Single
    writes of the same GiB here took anywhere from 0.3 to 1.8 GiB/s, so a lone baseline
    said more about the moment than about the save."""
    throughput, durable, raw = [], [], []
    for i in range(rounds):
        raw.append(raw_write_bandwidth(nbytes, f"{workdir}/raw.bin"))
        bandwidth, seconds = notice_save(state, f"{workdir}/notice-{i}", nbytes, validation)
        throughput.append(bandwidth / raw[-1])
        durable.append(seconds / (nbytes / raw[-1]))
    return statistics.median(throughput), statistics.median(durable), statistics.median(raw)


def validation_seconds(state: TrainState, uri: str, repeats: int = 3) -> float:
    """Median of `repeats` validations of one checkpoint: on this VM a single one swung
    from 0.9 to 3.6 s run to run (the first of a process also pays one-time costs)."""
    ckpt = Checkpointer(state, CheckpointConfig(uri=uri, interval_s=3600, validation=VALIDATION, handle_signals=False))
    ckpt.save(1, kind="notice")
    ckpt.close()
    ref = CheckpointRef(LocalStorage(uri), layout.step_dir(1))
    seconds = statistics.median(timed(lambda: validate_loaded(load(ref), VALIDATION)) for _ in range(repeats))
    drop(uri)
    return seconds


# glibc raises its mmap threshold as large blocks are freed, so whether a later 16 MiB
# gradient lands in a returned mapping or in the sticky heap depends on the process's
# history: the same probe's peak varied by ±0.05 GiB (±20 % of the state) run to run.
# A fixed threshold, the same for both probes, makes the peak what is actually live.
PROBE_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}


def peak_rss_bytes(mode: str, uri: str) -> int:
    """Peak RSS of a fresh process that builds the state and, in mode "save", saves it once."""
    out = subprocess.run([sys.executable, __file__, "--rss-probe", mode, "--uri", uri], capture_output=True, text=True,
                         env=os.environ | PROBE_MALLOC | {"BENCH_LAYERS": os.environ["BENCH_LAYERS"]}, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def rss_probe(mode: str, uri: str) -> None:
    """Both modes train the same steps; "save" also saves once while training goes on."""
    state = build_state()
    train_step(state)
    ckpt = None
    if mode == "save":
        ckpt = Checkpointer(state, CheckpointConfig(uri=uri, interval_s=3600, validation=VALIDATION, handle_signals=False))
        ckpt.save(1, kind="periodic")
    train_step(state)
    if ckpt is not None:
        ckpt.close()
        drop(uri)
    print(peak_rss_of_this_process())


def peak_rss_of_this_process() -> int:
    """VmHWM: this address space's high-water mark. (ru_maxrss would not do: Linux
    carries the parent's RSS across fork and exec into it.)"""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


@dataclass
class Figure:
    name: str
    value: float
    target: float
    at_most: bool  # True: value must be <= target

    @property
    def ok(self) -> bool:
        return self.value <= self.target if self.at_most else self.value >= self.target

    def line(self) -> str:
        op = "<=" if self.at_most else ">="
        return f"{self.name:<58} {self.value:8.3f}   target {op} {self.target:<5}  {'ok' if self.ok else 'MISS'}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gib", type=float, default=0.25, help="model + Adam state size (default 0.25)")
    parser.add_argument("--repeats", type=int, default=5, help="windows for the steps/s medians, rounds of raw write vs notice save")
    parser.add_argument("--interval", type=float, default=None, help="periodic interval for the steps/s figure (s)")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir on the repo's disk)")
    parser.add_argument("--check", action="store_true", help="exit 1 when any figure misses its target")
    parser.add_argument("--json", action="store_true", help="also print the figures as one JSON object")
    parser.add_argument("--smoke", action="store_true",
                        help="one layer, one round, a 1 s interval: the suite's run that keeps the bench working")
    parser.add_argument("--rss-probe", choices=("baseline", "save"), help=argparse.SUPPRESS)
    parser.add_argument("--uri", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.size_gib, args.repeats, args.interval = 0.01, 1, 1.0
    os.environ.setdefault("BENCH_LAYERS", str(layers_for(args.size_gib)))
    if args.rss_probe:
        rss_probe(args.rss_probe, args.uri)
        return 0

    workdir = tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir)
    try:
        state = build_state()
        nbytes = state_bytes(state)
        print(f"state: {nbytes / (1 << 30):.3f} GiB ({os.environ['BENCH_LAYERS']} layers of {WIDTH}x{WIDTH} + Adam), "
              f"torch threads {torch.get_num_threads()}, cpus {os.cpu_count()}", flush=True)
        step_s = 1 / steps_per_s(state, 2.0)
        sync_s = torch_save_fsync(state, f"{workdir}/sync.pt")
        notice_ratio, durable_ratio, raw_bw = notice_rounds(state, workdir, nbytes, args.repeats)
        dcp_s = dcp_async_blocking(state, workdir)
        stall_s = periodic_stall(state, f"{workdir}/periodic")
        print(f"one step {step_s:.3f} s; torch.save+fsync {sync_s:.2f} s; raw write {raw_bw / (1 << 30):.3f} GiB/s; "
              f"DCP async_save blocking {dcp_s:.3f} s; our stall {stall_s:.3f} s", flush=True)
        # A save costs training about the same time whatever the interval (mostly the disk
        # writes themselves: on the development VM each GiB written direct slowed a concurrent
        # training loop by 0.4-1.2 s however it was paced), so this figure is that cost over
        # the persist's window. The default interval is 600 s; this one is a
        # tenth of that, or 20 raw writes of the state if longer, to keep the bench minutes long.
        interval = args.interval or max(60.0, 20 * nbytes / raw_bw)
        speed_ratio, lost_s, persist_fraction = speed_during_persist(state, f"{workdir}/paced", interval, args.repeats)
        validate_s = validation_seconds(state, f"{workdir}/validate")
        print(f"periodic interval {interval:.0f} s (the longest persist took {persist_fraction:.2f} of it); "
              f"training time lost per periodic save {lost_s:.2f} s ({lost_s / step_s:.1f} steps); "
              f"validation {validate_s:.2f} s", flush=True)
        del state
        baseline_rss = peak_rss_bytes("baseline", f"{workdir}/rss")
        save_rss = peak_rss_bytes("save", f"{workdir}/rss")
        print(f"peak RSS: {baseline_rss / (1 << 30):.2f} GiB training only, {save_rss / (1 << 30):.2f} GiB with a save", flush=True)
        figures = [
            Figure("stall per save / sync torch.save+fsync", stall_s / sync_s, 0.05, True),
            Figure("stall per save / DCP async_save blocking (warm)", stall_s / dcp_s, 0.5, True),
            Figure("steps/s during paced persist / no checkpointing", speed_ratio, 0.90, False),
            Figure("notice persist throughput / raw write+fdatasync", notice_ratio, 0.85, False),
            Figure("notice-to-durable / (bytes / raw bandwidth)", durable_ratio, 1.25, True),
            Figure("extra peak host memory during a save / state size", (save_rss - baseline_rss) / nbytes, 1.0, True),
            Figure("validation (reload + forward) / one training step", validate_s / step_s, 2.0, True),
        ]
        for figure in figures:
            print(figure.line())
        if args.json:
            print(json.dumps({f.name: round(f.value, 4) for f in figures}))
        return 1 if args.check and not all(f.ok for f in figures) else 0
    finally:
        drop(workdir)


if __name__ == "__main__":
    sys.exit(main())
