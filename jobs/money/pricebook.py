"""The shipped default price book: list prices per (cloud, region, zone, type, market).

Pure Python (no Django) so the simulator and the cost ledger read the same file the
control plane seeds its PriceQuote table from. Each row is a quote
(respawn_server.jobs.money.prices) in force from midnight UTC of its `as_of` day; its
accelerator columns describe the instance type. An empty zone means "any zone of the
region"; a zone row, where present, is more specific and wins.
"""

from __future__ import annotations

import csv
import datetime as dt
from decimal import Decimal, InvalidOperation
from pathlib import Path

from respawn_server.jobs.money.prices import MARKETS, DiskQuote, Quote

DEFAULT_PRICE_BOOK = Path(__file__).parent / "data" / "pricebook.csv"
DEFAULT_DISK_PRICES = Path(__file__).parent / "data" / "disk_prices.csv"

PROVIDERS = ("aws", "gcp", "azure", "local")
COLUMNS = (
    "provider", "region", "zone", "instance_type", "accelerator",
    "accelerator_count", "market", "usd_per_hour", "source", "as_of",
)
DISK_COLUMNS = ("provider", "region", "sku", "usd_per_month", "source", "as_of")


class PriceBookError(ValueError):
    """A price book row that cannot be used; the message names the row and column."""


class PriceBook:
    """Validated quotes (`entries`) with the look-ups placement and the ledger need, and
    `accelerators`: how many one VM of each instance type carries (0: a CPU-only type)."""

    def __init__(self, entries: list[Quote], accelerators: dict[str, int]):
        self.entries = tuple(entries)
        self.accelerators = accelerators
        self._by_key = {}
        for entry in self.entries:
            if entry.key() in self._by_key:
                raise PriceBookError(f"duplicate price for {entry.key()}")
            self._by_key[entry.key()] = entry

    def price(self, *, provider: str, region: str, zone: str, instance_type: str,
              market: str) -> Quote | None:
        """The zone's own row if there is one, else the region-wide row, else None."""
        for candidate_zone in (zone, ""):
            entry = self._by_key.get((provider, region, candidate_zone, instance_type, market))
            if entry is not None:
                return entry
        return None

    def for_instance_type(self, instance_type: str, market: str | None = None) -> list[Quote]:
        return [e for e in self.entries
                if e.instance_type == instance_type and (market is None or e.market == market)]

    def spot_ratio(self, instance_type: str) -> Decimal | None:
        """Mean spot price ÷ mean on-demand price of a type, None unless the book has both."""
        spot = [e.usd_per_hour for e in self.for_instance_type(instance_type, "spot")]
        on_demand = [e.usd_per_hour for e in self.for_instance_type(instance_type, "on_demand")]
        if not spot or not on_demand:
            return None
        return (sum(spot) / len(spot)) / (sum(on_demand) / len(on_demand))


class _Row:
    """One CSV row's checked values; errors name the line and column."""

    def __init__(self, row: dict[str, str], line: int, required: tuple[str, ...]):
        self.row, self.line = row, line
        for column in required:
            if not (row.get(column) or "").strip():
                raise self.bad(column, "must not be empty")
        if row["provider"] not in PROVIDERS:
            raise self.bad("provider", f"must be one of {', '.join(PROVIDERS)}")

    def bad(self, column: str, why: str) -> PriceBookError:
        return PriceBookError(f"price book line {self.line}, column {column!r}: {why} (got {self.row.get(column)!r})")

    def price(self, column: str) -> Decimal:
        try:
            price = Decimal(self.row[column])
        except InvalidOperation:
            raise self.bad(column, "must be a decimal number") from None
        if not price.is_finite() or price <= 0:
            raise self.bad(column, "must be a positive finite number")
        return price

    def as_of(self) -> dt.datetime:
        """The row's date as the moment its price is in force from: that day's midnight, UTC."""
        try:
            day = dt.date.fromisoformat(self.row["as_of"])
        except ValueError:
            raise self.bad("as_of", "must be a date YYYY-MM-DD") from None
        return dt.datetime.combine(day, dt.time(), tzinfo=dt.timezone.utc)


def _parse_row(row: dict[str, str], line: int) -> tuple[Quote, int]:
    """The row's quote, and how many accelerators its instance type carries."""
    checked = _Row(row, line, ("provider", "region", "instance_type", "market", "usd_per_hour", "source", "as_of"))
    if row["market"] not in MARKETS:
        raise checked.bad("market", f"must be one of {', '.join(MARKETS)}")
    price = checked.price("usd_per_hour")
    try:
        count = int(row["accelerator_count"] or "0")
    except ValueError:
        raise checked.bad("accelerator_count", "must be a whole number") from None
    if count < 0:
        raise checked.bad("accelerator_count", "must not be negative")
    if bool(count) != bool(row["accelerator"].strip()):
        raise checked.bad("accelerator", "must be named exactly when accelerator_count > 0")
    return Quote(
        provider=row["provider"], region=row["region"], zone=row["zone"].strip(),
        instance_type=row["instance_type"], market=row["market"], usd_per_hour=price,
        source=row["source"], observed_at=checked.as_of(),
    ), count


def _parse_disk_row(row: dict[str, str], line: int) -> DiskQuote:
    checked = _Row(row, line, DISK_COLUMNS)
    return DiskQuote(provider=row["provider"], region=row["region"], sku=row["sku"],
                     usd_per_month=checked.price("usd_per_month"), source=row["source"], observed_at=checked.as_of())


def _rows(text: str, columns: tuple[str, ...], parse) -> list:
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in columns if c not in (reader.fieldnames or ())]
    if missing:
        raise PriceBookError(f"price book header lacks column(s): {', '.join(missing)}")
    entries = []
    for line, row in enumerate(reader, start=2):
        if None in row or any(v is None for v in row.values()):
            raise PriceBookError(f"price book line {line}: expected {len(columns)} columns")
        entries.append(parse(row, line))
    return entries


def parse_price_book(text: str) -> PriceBook:
    rows = _rows(text, COLUMNS, _parse_row)
    accelerators: dict[str, int] = {}
    for quote, count in rows:
        if accelerators.setdefault(quote.instance_type, count) != count:
            raise PriceBookError(f"price book: {quote.instance_type} carries {accelerators[quote.instance_type]} "
                                 f"accelerators in one row and {count} in another")
    return PriceBook([quote for quote, _ in rows], accelerators)


def load_price_book(path: Path | str = DEFAULT_PRICE_BOOK) -> PriceBook:
    return parse_price_book(Path(path).read_text(encoding="utf-8"))


def parse_disk_prices(text: str) -> list[DiskQuote]:
    entries = _rows(text, DISK_COLUMNS, _parse_disk_row)
    keys = [(*e.key(), e.observed_at) for e in entries]
    if len(set(keys)) != len(keys):
        raise PriceBookError(f"disk prices: duplicate price for {next(k for k in keys if keys.count(k) > 1)}")
    return entries


def load_disk_prices(path: Path | str = DEFAULT_DISK_PRICES) -> list[DiskQuote]:
    """The shipped monthly prices of the managed disk tiers Azure VMs get (the refresher adds newer ones)."""
    return parse_disk_prices(Path(path).read_text(encoding="utf-8"))
