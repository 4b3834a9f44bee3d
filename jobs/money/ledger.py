"""The cost ledger (DESIGN.md §8): money from instance intervals and price quotes.

Pure functions over plain dataclasses (the quotes: respawn_server.jobs.money.prices), no
Django, so the control plane's accrual task and bench/simulate.py compute money with the
same code.

Conventions (binding for everything that shows money):
- Billing is per whole second. An interval covers the seconds floor(start) up to, not
  including, floor(end or now).
- The price of a second is the price in force at its first instant: the latest quote
  for (provider, region, zone, type, market) observed at or before it. A quote seen
  mid-second therefore applies from the next whole second.
- A zone-less quote applies to every zone of its region; once the zone has a quote
  of its own (at or before the moment), the zone's latest quote wins, because spot
  markets are priced per zone and a region figure is only a fallback.
- A second without any price in force is an error, never a silent zero.
- Intervals are split at UTC month boundaries. Baseline and waste are spread over
  months in proportion to the interval's seconds in each.
- A stopped VM that keeps its disk (an Azure spot VM evicted with policy Deallocate)
  bills that disk from the instance's end until the VM is deleted (or up to `now`):
  the seconds floor(end) up to floor(release or now), each at the disk's monthly
  price in force at its first instant, prorated at HOURS_PER_MONTH hours a month.
  It is part of spent and all of it is waste (`Waste.stopped_disk`), in the months
  its own seconds fall in.
- Sums are exact (price × whole seconds); division by 3600 and rounding to
  MONEY_QUANTUM happen once per reported figure.
- A drill's money is shown apart (`Drill`): a run that recovers from a drill
  (`InstanceInterval.drill`) spends its recomputed steps (the interrupted VM's lost
  work, run again) and its boot/restore on the drill, not as waste. It is part of
  spent (the bill), never of spot's: savings = baseline − (spent − drill).
"""

from __future__ import annotations

import bisect
import datetime as dt
import math
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal

from respawn_server.jobs.money.prices import DISK, MARKETS, DiskQuote, Quote

MONEY_QUANTUM = Decimal("0.00000001")
SECONDS_PER_HOUR = 3600
HOURS_PER_MONTH = 730
"""Azure prices a managed disk per month and bills it prorated on a month of 730 hours."""
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class LedgerError(ValueError):
    """Input the ledger cannot price; the message names the instance, key or moment."""


def _require_aware(value: dt.datetime, what: str) -> None:
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        raise LedgerError(f"{what} must be a timezone-aware datetime (got {value!r})")


def _whole_seconds(value: dt.datetime) -> int:
    delta = value - _EPOCH
    return delta.days * 86400 + delta.seconds  # floor: microseconds dropped


def _first_second_at_or_after(value: dt.datetime) -> int:
    delta = value - _EPOCH
    return delta.days * 86400 + delta.seconds + (1 if delta.microseconds else 0)


@dataclass(frozen=True, kw_only=True, slots=True)
class InstanceInterval:
    """One VM lifetime as the ledger sees it: when it was billed and what its work was worth."""

    instance_id: str
    provider: str
    region: str
    zone: str
    instance_type: str
    market: str
    start: dt.datetime
    """When the launch was fulfilled (billing starts)."""
    end: dt.datetime | None
    """None while the instance runs: billed up to `now`."""
    steps_kept: int = 0
    """Steps this instance contributed that survive in the job's kept checkpoint chain."""
    seconds_per_step: Decimal = Decimal(0)
    """Measured on this instance."""
    boot_restore_seconds: Decimal = Decimal(0)
    checkpoint_stall_seconds: Decimal = Decimal(0)
    recomputed_steps: int = 0
    """Steps this instance ran that had already been done (lost to an earlier interruption)."""
    stopped_disk: str = ""
    """Price SKU of the disk its stopped VM kept, billed from `end` (an Azure spot VM evicted
    with policy Deallocate); empty: nothing bills after `end`."""
    disk_released: dt.datetime | None = None
    """When that VM and its disk were deleted; None: the disk bills up to `now`."""
    drill: bool = False
    """This run replaced a VM a drill interrupted: its boot/restore and recomputed steps are the drill's."""

    def __post_init__(self):
        _require_aware(self.start, f"instance {self.instance_id} start")
        if self.end is not None:
            _require_aware(self.end, f"instance {self.instance_id} end")
            if self.end < self.start:
                raise LedgerError(f"instance {self.instance_id}: end {self.end} is before start {self.start}")
        if self.stopped_disk and self.end is None:
            raise LedgerError(f"instance {self.instance_id}: a stopped disk bills after the end, but it has none")
        if self.disk_released is not None:
            _require_aware(self.disk_released, f"instance {self.instance_id} disk_released")
            if not self.stopped_disk:
                raise LedgerError(f"instance {self.instance_id}: disk_released given without a stopped_disk")
            if self.disk_released < self.end:
                raise LedgerError(f"instance {self.instance_id}: disk_released {self.disk_released} "
                                  f"is before end {self.end}")
        if self.market not in MARKETS:
            raise LedgerError(f"instance {self.instance_id}: market must be one of {MARKETS} "
                              f"(got {self.market!r})")
        for name in ("steps_kept", "recomputed_steps", "seconds_per_step",
                     "boot_restore_seconds", "checkpoint_stall_seconds"):
            if getattr(self, name) < 0:
                raise LedgerError(f"instance {self.instance_id}: {name} must not be negative")


@dataclass(frozen=True, slots=True)
class Waste:
    recomputed: Decimal
    boot_restore: Decimal
    checkpoint_stalls: Decimal
    stopped_disk: Decimal = Decimal(0)
    """A stopped VM's disk, billed after the instance ended until the VM was deleted."""

    PARTS = ("recomputed", "boot_restore", "checkpoint_stalls", "stopped_disk")

    @property
    def total(self) -> Decimal:
        return self.recomputed + self.boot_restore + self.checkpoint_stalls + self.stopped_disk

    @property
    def of_work(self) -> Decimal:
        """The parts spent while the instance ran (spread over its months like its work)."""
        return self.total - self.stopped_disk


@dataclass(frozen=True, slots=True)
class Drill:
    """What drills cost: the interrupted VMs' lost work (run again by their replacements) and
    the replacements' boot and restore. Spent on a rehearsal, so neither waste nor spot's."""

    lost_work: Decimal = Decimal(0)
    replacement_boot: Decimal = Decimal(0)

    PARTS = ("lost_work", "replacement_boot")

    @property
    def total(self) -> Decimal:
        return self.lost_work + self.replacement_boot

    def __add__(self, other: Drill) -> Drill:
        return Drill(self.lost_work + other.lost_work, self.replacement_boot + other.replacement_boot)


@dataclass(frozen=True, kw_only=True, slots=True)
class InstanceCost:
    instance_id: str
    billed_seconds: int
    """Seconds the VM itself was billed (a stopped disk's seconds are not among them)."""
    seconds_by_month: dict[str, int]
    spent: Decimal
    """The VM and, after its end, its stopped disk."""
    spent_by_month: dict[str, Decimal]
    stopped_disk_seconds: int = 0
    stopped_disk_by_month: dict[str, Decimal] = field(default_factory=dict)
    baseline: Decimal
    """What this instance's kept work would have cost on on-demand of the same type."""
    waste: Waste
    drill: Drill = Drill()

    @property
    def spot_spent(self) -> Decimal:
        """Spent less what drills spent: the spot work's own cost."""
        return self.spent - self.drill.total

    @property
    def savings(self) -> Decimal:
        return self.baseline - self.spot_spent


@dataclass(frozen=True, kw_only=True, slots=True)
class MonthCost:
    spent: Decimal
    baseline: Decimal
    waste: Decimal
    drill: Decimal = Decimal(0)

    @property
    def savings(self) -> Decimal:
        return self.baseline - (self.spent - self.drill)


@dataclass(frozen=True, kw_only=True, slots=True)
class Ledger:
    instances: tuple[InstanceCost, ...]
    spent: Decimal
    baseline: Decimal
    waste: Waste
    by_month: dict[str, MonthCost] = field(default_factory=dict)
    drill: Drill = Drill()

    @property
    def spot_spent(self) -> Decimal:
        """Spent less what drills spent: the spot work's own cost."""
        return self.spent - self.drill.total

    @property
    def savings(self) -> Decimal:
        return self.baseline - self.spot_spent


class PriceIndex:
    """Quotes (VM and disk) arranged for fast 'price in force' look-ups and piecewise
    integration. A quote's `rate` is its price per its unit of time (hour or month)."""

    def __init__(self, quotes):
        by_key: dict[tuple, dict[int, Quote | DiskQuote]] = defaultdict(dict)
        for quote in sorted(quotes, key=lambda q: q.observed_at):
            series = by_key[quote.key()]
            second = _first_second_at_or_after(quote.observed_at)
            earlier = series.get(second)
            if earlier is not None and earlier.observed_at == quote.observed_at and earlier.rate != quote.rate:
                raise LedgerError(f"two quotes for {quote.key()} observed at {quote.observed_at} "
                                  f"disagree ({earlier.rate} vs {quote.rate})")
            series[second] = quote  # sorted input: the later observation wins its second
        self._series = {key: (sorted(s), [s[k].rate for k in sorted(s)])
                        for key, s in by_key.items()}
        self._schedules: dict[tuple, tuple[list[int], list[Decimal | None]]] = {}

    def schedule(self, provider, region, zone, instance_type, market):
        """(change seconds, prices): price i is in force from second i (None: no price)."""
        cache_key = (provider, region, zone, instance_type, market)
        if cache_key not in self._schedules:
            zoned = self._series.get(cache_key, ([], [])) if zone else ([], [])
            regional = self._series.get((provider, region, "", instance_type, market), ([], []))
            seconds = sorted(set(zoned[0]) | set(regional[0]))
            prices = [_latest(zoned, s) if zoned[0] and zoned[0][0] <= s else _latest(regional, s)
                      for s in seconds]
            self._schedules[cache_key] = (seconds, prices)
        return self._schedules[cache_key]

    def price_at(self, second: int, provider, region, zone, instance_type, market) -> Decimal | None:
        seconds, prices = self.schedule(provider, region, zone, instance_type, market)
        i = bisect.bisect_right(seconds, second) - 1
        return prices[i] if i >= 0 else None


def _latest(series, second):
    i = bisect.bisect_right(series[0], second) - 1
    return series[1][i] if i >= 0 else None


def _month_of(second: int) -> str:
    return (_EPOCH + dt.timedelta(seconds=second)).strftime("%Y-%m")


def _next_month_start(second: int) -> int:
    moment = _EPOCH + dt.timedelta(seconds=second)
    year, month = (moment.year + 1, 1) if moment.month == 12 else (moment.year, moment.month + 1)
    return _whole_seconds(dt.datetime(year, month, 1, tzinfo=dt.UTC))


def _rate_seconds_by_month(key: tuple, what: str, first: int, last: int,
                           prices: PriceIndex) -> tuple[dict[str, Decimal], dict[str, int]]:
    """Σ rate × seconds (exact), and the seconds, per month over [first, last), for the
    price series `key`; `what` names the priced thing in errors."""
    seconds, values = prices.schedule(*key)
    totals: dict[str, Decimal] = {}
    counts: dict[str, int] = {}
    cursor = first
    i = bisect.bisect_right(seconds, cursor) - 1
    while cursor < last:
        if i < 0 or values[i] is None:
            provider, region, zone, name, market = key
            raise LedgerError(f"{what}: no {market} price for {provider}/{region}/{zone or '*'}/{name} "
                              f"in force at {_EPOCH + dt.timedelta(seconds=cursor)}")
        price_ends = seconds[i + 1] if i + 1 < len(seconds) else math.inf
        stop = min(last, price_ends, _next_month_start(cursor))
        month = _month_of(cursor)
        totals[month] = totals.get(month, Decimal(0)) + values[i] * (stop - cursor)
        counts[month] = counts.get(month, 0) + stop - cursor
        cursor = stop
        if cursor == price_ends:
            i += 1
    return totals, counts


def _money(hour_seconds: Decimal) -> Decimal:
    return (hour_seconds / SECONDS_PER_HOUR).quantize(MONEY_QUANTUM)


def _disk_money(month_seconds: Decimal) -> Decimal:
    return (month_seconds / (HOURS_PER_MONTH * SECONDS_PER_HOUR)).quantize(MONEY_QUANTUM)


def _billed_range(interval: InstanceInterval, now: dt.datetime) -> tuple[int, int]:
    first = _whole_seconds(interval.start)
    end = interval.end if interval.end is not None else now
    if end < interval.start:
        raise LedgerError(f"instance {interval.instance_id} is running but now ({now}) "
                          f"is before its start ({interval.start})")
    return first, _whole_seconds(end)


def _stopped_disk_by_month(interval: InstanceInterval, prices: PriceIndex,
                           now: dt.datetime) -> tuple[dict[str, Decimal], int]:
    """The stopped disk's money per month (USD) and its billed seconds."""
    if not interval.stopped_disk:
        return {}, 0
    released = interval.disk_released if interval.disk_released is not None else now
    if released < interval.end:
        raise LedgerError(f"instance {interval.instance_id}: its stopped disk is still billed but now ({now}) "
                          f"is before its end ({interval.end})")
    first, last = _whole_seconds(interval.end), _whole_seconds(released)
    key = (interval.provider, interval.region, "", interval.stopped_disk, DISK)
    by_month, counts = _rate_seconds_by_month(key, f"instance {interval.instance_id}'s stopped disk",
                                              first, last, prices)
    return {m: _disk_money(v) for m, v in sorted(by_month.items())}, sum(counts.values())


def cost_instance(interval: InstanceInterval, prices: PriceIndex, now: dt.datetime) -> InstanceCost:
    first, last = _billed_range(interval, now)
    key = (interval.provider, interval.region, interval.zone, interval.instance_type, interval.market)
    by_month, seconds_by_month = _rate_seconds_by_month(key, f"instance {interval.instance_id}", first, last, prices)
    total = sum(by_month.values(), Decimal(0))
    billed = last - first
    disk_by_month, disk_seconds = _stopped_disk_by_month(interval, prices, now)

    on_demand = prices.price_at(first, interval.provider, interval.region, interval.zone,
                                interval.instance_type, "on_demand")
    if on_demand is None and interval.steps_kept:
        raise LedgerError(f"instance {interval.instance_id}: no on_demand price for "
                          f"{interval.provider}/{interval.region}/{interval.instance_type} at its start, "
                          f"so its kept work has no baseline")
    kept_seconds = interval.steps_kept * Decimal(interval.seconds_per_step)
    baseline = kept_seconds * on_demand if interval.steps_kept else Decimal(0)

    # Waste is priced at what this instance paid on average per second.
    def wasted(seconds) -> Decimal:
        return _money(Decimal(seconds) * total / billed) if billed else Decimal(0)

    spent_by_month = {m: _money(v) for m, v in by_month.items()}
    for month, value in disk_by_month.items():
        spent_by_month[month] = spent_by_month.get(month, Decimal(0)) + value
    disk = sum(disk_by_month.values(), Decimal(0))
    recomputed = wasted(interval.recomputed_steps * Decimal(interval.seconds_per_step))
    boot_restore = wasted(interval.boot_restore_seconds)
    drill = Drill(recomputed, boot_restore) if interval.drill else Drill()
    return InstanceCost(
        instance_id=interval.instance_id,
        billed_seconds=billed,
        seconds_by_month=dict(sorted(seconds_by_month.items())),
        spent=_money(total) + disk,
        spent_by_month=dict(sorted(spent_by_month.items())),
        stopped_disk_seconds=disk_seconds,
        stopped_disk_by_month=disk_by_month,
        baseline=_money(baseline),
        waste=Waste(
            recomputed=recomputed - drill.lost_work,
            boot_restore=boot_restore - drill.replacement_boot,
            checkpoint_stalls=wasted(interval.checkpoint_stall_seconds),
            stopped_disk=disk,
        ),
        drill=drill,
    )


def build_ledger(intervals, quotes, now: dt.datetime) -> Ledger:
    """Spent, on-demand baseline, savings and waste for a set of instances, per month too."""
    _require_aware(now, "now")
    prices = quotes if isinstance(quotes, PriceIndex) else PriceIndex(quotes)
    intervals = tuple(intervals)
    costs = tuple(cost_instance(i, prices, now) for i in intervals)
    months: dict[str, list[Decimal]] = defaultdict(lambda: [Decimal(0)] * 4)
    for interval, cost in zip(intervals, costs):
        # an instance billed for no whole second still owns its kept work: its start month gets it
        shares = ({m: Decimal(s) / cost.billed_seconds for m, s in cost.seconds_by_month.items()}
                  if cost.billed_seconds else {interval.start.astimezone(dt.UTC).strftime("%Y-%m"): Decimal(1)})
        for month, share in shares.items():
            row = months[month]
            row[1] += cost.baseline * share
            row[2] += cost.waste.of_work * share
            row[3] += cost.drill.total * share
        for month, value in cost.spent_by_month.items():
            months[month][0] += value
        for month, value in cost.stopped_disk_by_month.items():
            months[month][2] += value
    return Ledger(
        instances=costs,
        spent=sum((c.spent for c in costs), Decimal(0)),
        baseline=sum((c.baseline for c in costs), Decimal(0)),
        waste=Waste(*(sum((getattr(c.waste, part) for c in costs), Decimal(0)) for part in Waste.PARTS)),
        by_month={m: MonthCost(spent=s, baseline=b.quantize(MONEY_QUANTUM), waste=w.quantize(MONEY_QUANTUM),
                               drill=d.quantize(MONEY_QUANTUM))
                  for m, (s, b, w, d) in sorted(months.items())},
        drill=sum((c.drill for c in costs), Drill()),
    )
