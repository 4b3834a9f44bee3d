"""The local provider's spot market: when each local "VM" is preempted, and
whether a zone has capacity for a launch right now.

Pure: no clock and no processes. The caller passes times as seconds on the
market's clock (real seconds since the market's epoch); the market scales them
by `time_compression` where a mode speaks in market time (rate, trace). Every
random draw is a function of (seed, the VM's key) alone, so the same VM gets the
same fate whatever the order of launches.

Modes:
- `none`: never preempted.
- `every`: preempted `every_s` real seconds after boot (deterministic, for tests).
- `rate`: exponential time to preemption, `rate_per_hour` preemptions per market hour.
- `trace`: a zone's availability trace (`{"metadata": {"gap_seconds": N}, "data":
  [v0, v1, ...]}`, e.g. data/spot-traces/): a launch at a tick with
  value 0 is refused; a VM is preempted at the first later tick with value 0.
  Past its end a trace starts again from its beginning.
With `max_preemptions`, only the first that many spot VMs of any mode are ever
preempted and later ones run on: a demo or a test that wants exactly N
interruptions, however slowly the machine trains.
On-demand VMs are never preempted and only refused in a zone listed as out of
capacity.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass, field
from typing import Mapping

MODES = ("none", "every", "rate", "trace")
ANY_ZONE = "*"  # a trace_files key: the trace of zones not listed


@dataclass(frozen=True, kw_only=True)
class Trace:
    """Availability per tick: `values[i]` spot VMs available from `i * gap_s` on."""

    gap_s: float
    values: tuple[int, ...]
    source: str = ""

    def __post_init__(self) -> None:
        if not self.gap_s > 0:
            raise ValueError(f"trace {self.source or '(inline)'}: gap_seconds must be > 0, got {self.gap_s}")
        if not self.values:
            raise ValueError(f"trace {self.source or '(inline)'}: no data")

    @property
    def length_s(self) -> float:
        return self.gap_s * len(self.values)

    def tick(self, t: float) -> int:
        """The tick in force at market time `t` (seconds, wrapping past the end)."""
        return int(math.floor(t / self.gap_s)) % len(self.values)

    def available(self, t: float) -> bool:
        return self.values[self.tick(t)] > 0

    def next_unavailable_after(self, t: float) -> float | None:
        """Market time of the first tick after the one in force at `t` with no
        availability; None when the trace never has a 0."""
        n = len(self.values)
        current = int(math.floor(t / self.gap_s))
        for step in range(1, n + 1):
            if self.values[(current + step) % n] == 0:
                return (current + step) * self.gap_s
        return None


def load_trace(path: str) -> Trace:
    """Read one trace file, refusing anything but the documented shape."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"spot trace {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"spot trace {path} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("metadata"), dict) or not isinstance(doc.get("data"), list):
        raise ValueError(f'spot trace {path} must look like {{"metadata": {{"gap_seconds": N}}, "data": [v0, v1, ...]}}')
    gap = doc["metadata"].get("gap_seconds")
    if isinstance(gap, bool) or not isinstance(gap, (int, float)):
        raise ValueError(f"spot trace {path}: metadata.gap_seconds must be a number, got {gap!r}")
    for i, value in enumerate(doc["data"]):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"spot trace {path}: data[{i}] must be a non-negative integer, got {value!r}")
    return Trace(gap_s=float(gap), values=tuple(doc["data"]), source=path)


@dataclass(frozen=True, kw_only=True)
class MarketConfig:
    mode: str = "none"
    every_s: float = 60.0
    """`every`: real seconds from boot to the preemption notice."""
    rate_per_hour: float = 1.0
    """`rate`: mean preemptions per market hour."""
    trace_files: Mapping[str, str] = field(default_factory=dict)
    """`trace`: zone -> trace file; the key "*" covers zones not listed."""
    time_compression: float = 1.0
    """Market seconds per real second (`rate` and `trace`): 3600 plays an hour of trace per second."""
    seed: int = 0
    max_preemptions: int | None = None
    """At most this many spot VMs are preempted; None: no limit."""
    out_of_capacity_zones: frozenset[str] = frozenset()
    """Zones that refuse every launch, spot or on-demand."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"local market mode {self.mode!r} is not one of {', '.join(MODES)}")
        if not self.every_s > 0:
            raise ValueError(f"local market every_s must be > 0, got {self.every_s}")
        if not self.rate_per_hour > 0:
            raise ValueError(f"local market rate_per_hour must be > 0, got {self.rate_per_hour}")
        if self.max_preemptions is not None and not self.max_preemptions >= 0:
            raise ValueError(f"local market max_preemptions must be >= 0, got {self.max_preemptions}")
        if not self.time_compression > 0:
            raise ValueError(f"local market time_compression must be > 0, got {self.time_compression}")
        if self.mode == "trace" and not self.trace_files:
            raise ValueError("local market mode 'trace' needs trace_files: {zone: path} (key '*' for every other zone)")
        object.__setattr__(self, "out_of_capacity_zones", frozenset(self.out_of_capacity_zones))
        object.__setattr__(self, "trace_files", dict(self.trace_files))


class SpotMarket:
    def __init__(self, config: MarketConfig, traces: Mapping[str, Trace] | None = None):
        """`traces` by zone (key "*" for the rest); loaded from `config.trace_files` when None."""
        self.config = config
        if traces is None:
            traces = {zone: load_trace(path) for zone, path in config.trace_files.items()} if config.mode == "trace" else {}
        self.traces = dict(traces)

    def trace_for(self, zone: str) -> Trace:
        trace = self.traces.get(zone) or self.traces.get(ANY_ZONE)
        if trace is None:
            raise ValueError(f"local market: no spot trace for zone {zone!r} (trace_files has {', '.join(sorted(self.traces)) or 'none'}; add the zone or '*')")
        return trace

    def capacity_refusal(self, zone: str, *, spot: bool, now_s: float) -> str:
        """Why a launch in `zone` at real time `now_s` is refused; "" when it is not."""
        if zone in self.config.out_of_capacity_zones:
            return f"zone {zone} is out of capacity (configured)"
        if spot and self.config.mode == "trace":
            t = now_s * self.config.time_compression
            trace = self.trace_for(zone)
            if not trace.available(t):
                return f"no spot capacity in zone {zone} at trace tick {trace.tick(t)} of {trace.source or 'the trace'}"
        return ""

    def preemption_delay_s(self, vm_key: str, zone: str, *, spot: bool, launched_at_s: float,
                           preempted_before: int = 0) -> float | None:
        """Real seconds from launch to the notice of VM `vm_key`; None: never preempted.
        `preempted_before`: the spot VMs launched before it that were given a preemption."""
        mode = self.config.mode
        limit = self.config.max_preemptions
        if not spot or mode == "none" or (limit is not None and preempted_before >= limit):
            return None
        if mode == "every":
            return self.config.every_s
        if mode == "rate":
            market_s = self._rng(vm_key).expovariate(self.config.rate_per_hour / 3600.0)
            return market_s / self.config.time_compression
        t = launched_at_s * self.config.time_compression
        at = self.trace_for(zone).next_unavailable_after(t)
        return None if at is None else (at - t) / self.config.time_compression

    def _rng(self, vm_key: str) -> random.Random:
        digest = hashlib.sha256(f"{self.config.seed}:{vm_key}".encode()).digest()
        return random.Random(int.from_bytes(digest[:8], "big"))
