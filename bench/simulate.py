"""Replay spot traces through the production policies and the production ledger.

Fixed protocol (issue 8), so results cannot be tuned by choice of parameters:
per trace file 20 evenly spaced start offsets; job length = 1/4 of the trace's span;
restart overhead 6 min; checkpoint cost 1 min; deadlines 1.5x and 2x the job length;
prices in units of on-demand, spot = 0.3 x on-demand unless the price book has both
for the type; multi-node folders ("<N>-node") run gangs of N; both readings of a
value ("count": value = spot instances available; "nonzero-unavailable": the paper
simulator's reading of the 1-node files). Preemptions come without a usable notice
(a trace only says a tick had no capacity), so work since the last checkpoint is lost.

    .venv/bin/python bench/simulate.py [--traces DIR] [--png PATH] [--check] [--jobs N]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from respawn_server.jobs.fleet.policies import market  # noqa: E402
from respawn_server.jobs.fleet.policies.expected_cost import spot_overhead_fraction  # noqa: E402
from respawn_server.jobs.fleet.policies.interval import checkpoint_interval  # noqa: E402
from respawn_server.jobs.fleet.policies.rates import Lifetime, RatePrior, estimate_availability, estimate_rate, on_demand_rate  # noqa: E402
from respawn_server.jobs.money.ledger import InstanceInterval, PriceIndex, build_ledger  # noqa: E402
from respawn_server.jobs.money.pricebook import load_price_book  # noqa: E402
from respawn_server.jobs.money.prices import Quote  # noqa: E402

DEFAULT_TRACES = Path(__file__).resolve().parents[1] / "data" / "spot-traces"
OFFSETS = 20
JOB_FRACTION = 0.25
RESTART_S = 360.0
CHECKPOINT_S = 60.0
DEADLINE_FACTORS = (1.5, 2.0)
DEFAULT_SPOT_RATIO = Decimal("0.3")
POLICIES = ("on_demand", "greedy", "uniform_progress", "ours")
READINGS = ("count", "nonzero-unavailable")
EPOCH = dt.datetime(2023, 1, 1, tzinfo=dt.UTC)
EPS = 1e-6

# trace file stem "<zone>_<kind>_<n>" -> instance type
INSTANCE_TYPES = {
    "v100_1": "p3.2xlarge", "v100_8": "p3.16xlarge", "k80_1": "p2.xlarge", "k80_8": "p2.16xlarge",
    "intel_64": "r5.16xlarge", "c3-88": "c3-highcpu-88",
}


@dataclass(frozen=True, kw_only=True)
class Trace:
    path: Path
    folder: str
    provider: str
    region: str
    zone: str
    instance_type: str
    nodes: int
    gap_s: float
    values: tuple[int, ...]

    def available(self, reading: str) -> list[bool]:
        if reading == "count":
            return [v >= self.nodes for v in self.values]
        return [v == 0 for v in self.values]


def load_trace(path: Path, root: Path) -> Trace:
    raw = json.loads(path.read_text())
    try:
        gap = float(raw["metadata"]["gap_seconds"])
        values = tuple(int(v) for v in raw["data"])
    except (KeyError, TypeError, ValueError) as exc:
        raise SystemExit(f"{path}: not a trace file ({{'metadata': {{'gap_seconds': N}}, 'data': [...]}}): {exc}")
    if gap <= 0 or len(values) < 8:
        raise SystemExit(f"{path}: needs gap_seconds > 0 and at least 8 values")
    folder = str(path.parent.relative_to(root)) if path.parent != root else path.parent.name
    provider = "gcp" if "gcp" in folder.lower() else "aws"
    nodes_match = re.search(r"(\d+)-node", folder)
    zone, _, kind = path.stem.partition("_")
    region = zone.rsplit("-", 1)[0] if provider == "gcp" else zone.rstrip("abcdefghijklmnopqrstuvwxyz")
    return Trace(path=path, folder=folder, provider=provider, region=region, zone=zone,
                 instance_type=INSTANCE_TYPES.get(kind, kind), nodes=int(nodes_match.group(1)) if nodes_match else 1,
                 gap_s=gap, values=values)


# ---- one run -------------------------------------------------------------------------------

@dataclass
class Instance:
    market: str
    started: float
    interval_s: float
    overhead_left: float = RESTART_S
    checkpoint_left: float = 0.0
    since_checkpoint: float = 0.0
    worked: float = 0.0
    stalled: float = 0.0


@dataclass
class Run:
    """The state of one simulated job."""

    work_s: float
    progress: float = 0.0
    committed: float = 0.0
    instance: Instance | None = None
    lost_s: float = 0.0
    redo_pending: float = 0.0
    finished_at: float | None = None
    ended: list = field(default_factory=list)  # (Instance, end time, kept work, redone work)
    lifetimes: list = field(default_factory=list)
    available_s: float = 0.0
    observed_s: float = 0.0

    def end_instance(self, now: float, *, preempted: bool) -> None:
        inst = self.instance
        lost = self.progress - self.committed if preempted else 0.0
        kept = inst.worked - lost
        redone = min(self.redo_pending, kept)  # work an earlier instance lost, done again here
        self.redo_pending += lost - redone
        self.lost_s += lost
        # a planned stop saves first (part of the restart overhead); a preemption loses unsaved work
        self.progress = self.committed if preempted else self.progress
        self.committed = self.progress
        if inst.market == market.SPOT:
            self.lifetimes.append(Lifetime(hours=(now - inst.started) / 3600, interrupted=preempted))
        self.ended.append((inst, now, max(kept, 0.0), redone))
        self.instance = None

    def advance(self, now: float, dt_s: float) -> None:
        """Run the live instance for dt_s: restart overhead, then work/checkpoint cycles."""
        inst, used = self.instance, 0.0
        while used < dt_s - EPS:
            left = dt_s - used
            if inst.overhead_left > EPS:
                step = min(inst.overhead_left, left)
                inst.overhead_left -= step
            elif inst.checkpoint_left > EPS:
                step = min(inst.checkpoint_left, left)
                inst.checkpoint_left -= step
                inst.stalled += step
                if inst.checkpoint_left <= EPS:
                    self.committed = self.progress
            else:
                step = min(left, inst.interval_s - inst.since_checkpoint, self.work_s - self.progress)
                self.progress += step
                inst.worked += step
                inst.since_checkpoint += step
                if self.progress >= self.work_s - EPS:
                    self.progress = self.committed = self.work_s
                    self.finished_at = now + used + step
                    self.end_instance(self.finished_at, preempted=False)
                    return
                if inst.since_checkpoint >= inst.interval_s - EPS:
                    inst.since_checkpoint, inst.checkpoint_left = 0.0, CHECKPOINT_S
            used += step


PRIOR = RatePrior.from_bucket()
OD_INTERVAL_S = checkpoint_interval(checkpoint_cost_s=CHECKPOINT_S, rate=on_demand_rate()).seconds


def decide(policy: str, clock: market.JobClock, run: Run, spot_interval_s: float, rate) -> str | None:
    if policy == "on_demand":
        return market.ON_DEMAND
    if policy == "greedy":
        return market.greedy(clock)
    if policy == "uniform_progress":
        return market.uniform_progress(clock)
    availability = estimate_availability(available_s=run.available_s, observed_s=run.observed_s)
    overhead = spot_overhead_fraction(rate=rate, availability=availability, restart_s=RESTART_S,
                                      checkpoint_cost_s=CHECKPOINT_S, interval_s=spot_interval_s)
    return market.deadline_aware(clock, spot_overhead_fraction=overhead)


def simulate(available: list[bool], gap_s: float, start_tick: int, work_s: float, deadline_s: float,
             policy: str) -> Run:
    run = Run(work_s=work_s)
    rate = estimate_rate([], PRIOR)
    spot_interval = checkpoint_interval(checkpoint_cost_s=CHECKPOINT_S, rate=rate).seconds
    tick = start_tick
    while run.finished_at is None:
        now = (tick - start_tick) * gap_s
        spot_ok = available[tick] if tick < len(available) else False
        run.observed_s += gap_s
        run.available_s += gap_s if spot_ok else 0.0
        if run.instance and run.instance.market == market.SPOT and not spot_ok:
            run.end_instance(now, preempted=True)
            rate = estimate_rate(run.lifetimes, PRIOR)
            spot_interval = checkpoint_interval(checkpoint_cost_s=CHECKPOINT_S, rate=rate).seconds
        running = run.instance.market if run.instance else None
        clock = market.JobClock(
            now=now, started_at=0.0, deadline=deadline_s, total_work_s=work_s,
            remaining_work_s=work_s - run.progress, unsaved_work_s=run.progress - run.committed,
            running=running, spot_available=spot_ok, restart_s=RESTART_S, checkpoint_cost_s=CHECKPOINT_S,
            on_demand_interval_s=OD_INTERVAL_S, decision_period_s=gap_s)
        wanted = decide(policy, clock, run, spot_interval, rate)
        if wanted != running:
            if run.instance:
                run.end_instance(now, preempted=False)
            if wanted == market.ON_DEMAND or (wanted == market.SPOT and spot_ok):
                run.instance = Instance(market=wanted, started=now,
                                        interval_s=spot_interval if wanted == market.SPOT else OD_INTERVAL_S)
        if run.instance:
            run.advance(now, gap_s)
        tick += 1
    return run


# ---- money through the production ledger ---------------------------------------------------

def price_index(trace: Trace, spot_ratio: Decimal) -> PriceIndex:
    seen = EPOCH - dt.timedelta(days=1)
    return PriceIndex([
        Quote(provider=trace.provider, region=trace.region, zone="", instance_type=trace.instance_type,
              market=m, usd_per_hour=p, observed_at=seen)
        for m, p in ((market.ON_DEMAND, Decimal(1)), (market.SPOT, spot_ratio))])


def run_cost(trace: Trace, run: Run, prices: PriceIndex) -> Decimal:
    intervals = []
    for n, (inst, end, kept, redone) in enumerate(run.ended):
        for rank in range(trace.nodes):
            intervals.append(InstanceInterval(
                instance_id=f"{n}-{rank}", provider=trace.provider, region=trace.region, zone=trace.zone,
                instance_type=trace.instance_type, market=inst.market,
                start=EPOCH + dt.timedelta(seconds=inst.started), end=EPOCH + dt.timedelta(seconds=end),
                steps_kept=round(kept), seconds_per_step=Decimal(1), boot_restore_seconds=Decimal(RESTART_S),
                checkpoint_stall_seconds=Decimal(round(inst.stalled)), recomputed_steps=round(redone)))
    return build_ledger(intervals, prices, now=EPOCH + dt.timedelta(seconds=run.finished_at)).spent


@dataclass(frozen=True)
class Outcome:
    folder: str
    reading: str
    factor: float
    policy: str
    cost_ratio: float
    met: bool
    lost_fraction: float


def trace_outcomes(args) -> list[Outcome]:
    path, root, spot_ratio, offsets = args
    trace = load_trace(path, root)
    prices = price_index(trace, spot_ratio)
    span = len(trace.values) * trace.gap_s
    work = JOB_FRACTION * span
    last_start = len(trace.values) - int(max(DEADLINE_FACTORS) * work / trace.gap_s) - 1
    starts = [round(i * last_start / (offsets - 1)) for i in range(offsets)] if offsets > 1 else [0]
    results = []
    for reading in READINGS:
        available = trace.available(reading)
        for factor in DEADLINE_FACTORS:
            for start in starts:
                costs = {}
                for policy in POLICIES:
                    run = simulate(available, trace.gap_s, start, work, factor * work, policy)
                    costs[policy] = (run_cost(trace, run, prices), run)
                baseline = costs["on_demand"][0]
                for policy, (cost, run) in costs.items():
                    results.append(Outcome(trace.folder, reading, factor, policy, float(cost / baseline),
                                           run.finished_at <= factor * work + EPS, run.lost_s / work))
    return results


# ---- report --------------------------------------------------------------------------------

def summarise(outcomes: list[Outcome]) -> dict:
    table: dict = {}
    for o in outcomes:
        cell = table.setdefault((o.folder, o.reading, o.factor), {}).setdefault(o.policy, [0.0, 0, 0.0, 0])
        cell[0] += o.cost_ratio
        cell[1] += o.met
        cell[2] += o.lost_fraction
        cell[3] += 1
    return {k: {p: (c / n, met / n, lost / n) for p, (c, met, lost, n) in v.items()} for k, v in table.items()}


def print_table(summary: dict) -> None:
    head = f"{'trace folder':38} {'reading':19} {'dl':>4} " + " ".join(f"{p:>22}" for p in POLICIES)
    print(head)
    print(" " * 64 + " ".join(f"{'cost  met%  lost%':>22}" for _ in POLICIES))
    for (folder, reading, factor), cells in sorted(summary.items()):
        row = " ".join(f"{cells[p][0]:6.3f} {cells[p][1]*100:5.0f} {cells[p][2]*100:6.2f}".rjust(22)
                       for p in POLICIES)
        print(f"{folder:38} {reading:19} {factor:4.1f} {row}")
    for policy in POLICIES:
        mean = sum(c[policy][0] for c in summary.values()) / len(summary)
        print(f"mean cost / on-demand, {policy:17}: {mean:.3f}")


def check(summary: dict) -> list[str]:
    misses = []
    for key, cells in sorted(summary.items()):
        if cells["ours"][1] < 1:
            misses.append(f"{key}: ours met {cells['ours'][1]:.0%} of deadlines")
        if cells["ours"][0] > cells["uniform_progress"][0] + 1e-9:
            misses.append(f"{key}: ours costs {cells['ours'][0]:.4f} > uniform progress {cells['uniform_progress'][0]:.4f}")
    ours = sum(c["ours"][0] for c in summary.values())
    up = sum(c["uniform_progress"][0] for c in summary.values())
    if ours >= up:
        misses.append(f"ours is not cheaper than uniform progress on average ({ours:.4f} >= {up:.4f})")
    return misses


def write_png(summary: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(READINGS), figsize=(11, 4), sharey=True)
    for ax, reading in zip(axes, READINGS):
        for policy in POLICIES:
            xs = sorted({f for (_, r, f) in summary if r == reading})
            ys = [sum(c[policy][0] for (_, r, f), c in summary.items() if r == reading and f == x)
                  / sum(1 for (_, r, f) in summary if r == reading and f == x) for x in xs]
            ax.plot([x - 1 for x in xs], ys, marker="o", label=policy)
        ax.set_title(f"reading: {reading}")
        ax.set_xlabel("deadline slack (x job length)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("cost / on-demand cost (mean over folders)")
    axes[0].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES,
                        help="folder of trace JSON files (searched recursively)")
    parser.add_argument("--png", type=Path, default=Path("var/bench/simulate.png"), help="where to write the plot")
    parser.add_argument("--check", action="store_true", help="exit 1 unless ours meets every deadline and beats UP")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--offsets", type=int, default=OFFSETS, help=argparse.SUPPRESS)  # tests only
    parser.add_argument("--smoke", action="store_true",
                        help="the 4-node traces, one start offset, the plot under var/bench/simulate-smoke.png: "
                             "the suite's run that keeps the bench working")
    args = parser.parse_args(argv)
    if args.smoke:
        args.traces, args.offsets, args.jobs = DEFAULT_TRACES / "preemption" / "4-node", 1, 1
        args.png = args.png.with_name("simulate-smoke.png")
    files = sorted(args.traces.rglob("*.json"))
    if not files:
        parser.error(f"no trace files (*.json) under {args.traces}")
    book = load_price_book()
    tasks = []
    for path in files:
        itype = load_trace(path, args.traces).instance_type
        tasks.append((path, args.traces, book.spot_ratio(itype) or DEFAULT_SPOT_RATIO, args.offsets))
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            outcomes = [o for chunk in pool.map(trace_outcomes, tasks) for o in chunk]
    else:
        outcomes = [o for task in tasks for o in trace_outcomes(task)]
    summary = summarise(outcomes)
    print_table(summary)
    write_png(summary, args.png)
    print(f"plot: {args.png}")
    if args.check:
        misses = check(summary)
        for miss in misses:
            print("MISS", miss)
        return 1 if misses else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
