"""The shipped default price book: list prices per (cloud, region, zone, type, market).

Pure Python (no Django) so the simulator and the cost ledger read the same file the
control plane seeds its PriceQuote table from. An empty zone means "any zone of the
region"; a zone row, where present, is more specific and wins.
"""

from __future__ import annotations

import csv
import datetime as dt
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

DEFAULT_PRICE_BOOK = Path(__file__).parent / "data" / "pricebook.csv"

PROVIDERS = ("aws", "gcp", "azure", "local")
MARKETS = ("spot", "on_demand")
COLUMNS = (
    "provider", "region", "zone", "instance_type", "accelerator",
    "accelerator_count", "market", "usd_per_hour", "source", "as_of",
)


class PriceBookError(ValueError):
    """A price book row that cannot be used; the message names the row and column."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PriceBookEntry:
    provider: str
    region: str
    zone: str
    """Empty: the price applies to every zone of the region without a zone row."""
    instance_type: str
    accelerator: str
    """Empty for CPU-only types."""
    accelerator_count: int
    market: str
    usd_per_hour: Decimal
    source: str
    as_of: dt.date


class PriceBook:
    """Validated entries with the look-ups placement and the ledger need."""

    def __init__(self, entries: list[PriceBookEntry]):
        self.entries = tuple(entries)
        self._by_key = {}
        for entry in self.entries:
            key = (entry.provider, entry.region, entry.zone, entry.instance_type, entry.market)
            if key in self._by_key:
                raise PriceBookError(f"duplicate price for {key}")
            self._by_key[key] = entry

    def price(self, *, provider: str, region: str, zone: str, instance_type: str,
              market: str) -> PriceBookEntry | None:
        """The zone's own row if there is one, else the region-wide row, else None."""
        for candidate_zone in (zone, ""):
            entry = self._by_key.get((provider, region, candidate_zone, instance_type, market))
            if entry is not None:
                return entry
        return None

    def for_instance_type(self, instance_type: str, market: str | None = None) -> list[PriceBookEntry]:
        return [e for e in self.entries
                if e.instance_type == instance_type and (market is None or e.market == market)]

    def spot_ratio(self, instance_type: str) -> Decimal | None:
        """Mean spot price ÷ mean on-demand price of a type, None unless the book has both."""
        spot = [e.usd_per_hour for e in self.for_instance_type(instance_type, "spot")]
        on_demand = [e.usd_per_hour for e in self.for_instance_type(instance_type, "on_demand")]
        if not spot or not on_demand:
            return None
        return (sum(spot) / len(spot)) / (sum(on_demand) / len(on_demand))


def _parse_row(row: dict[str, str], line: int) -> PriceBookEntry:
    def bad(column: str, why: str) -> PriceBookError:
        return PriceBookError(f"price book line {line}, column {column!r}: {why} (got {row.get(column)!r})")

    for column in ("provider", "region", "instance_type", "market", "usd_per_hour", "source", "as_of"):
        if not (row.get(column) or "").strip():
            raise bad(column, "must not be empty")
    if row["provider"] not in PROVIDERS:
        raise bad("provider", f"must be one of {', '.join(PROVIDERS)}")
    if row["market"] not in MARKETS:
        raise bad("market", f"must be one of {', '.join(MARKETS)}")
    try:
        price = Decimal(row["usd_per_hour"])
    except InvalidOperation:
        raise bad("usd_per_hour", "must be a decimal number") from None
    if not price.is_finite() or price <= 0:
        raise bad("usd_per_hour", "must be a positive finite number")
    try:
        count = int(row["accelerator_count"] or "0")
    except ValueError:
        raise bad("accelerator_count", "must be a whole number") from None
    if count < 0:
        raise bad("accelerator_count", "must not be negative")
    if bool(count) != bool(row["accelerator"].strip()):
        raise bad("accelerator", "must be named exactly when accelerator_count > 0")
    try:
        as_of = dt.date.fromisoformat(row["as_of"])
    except ValueError:
        raise bad("as_of", "must be a date YYYY-MM-DD") from None
    return PriceBookEntry(
        provider=row["provider"], region=row["region"], zone=row["zone"].strip(),
        instance_type=row["instance_type"], accelerator=row["accelerator"].strip(),
        accelerator_count=count, market=row["market"], usd_per_hour=price,
        source=row["source"], as_of=as_of,
    )


def parse_price_book(text: str) -> PriceBook:
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise PriceBookError(f"price book header lacks column(s): {', '.join(missing)}")
    entries = []
    for line, row in enumerate(reader, start=2):
        if None in row or any(v is None for v in row.values()):
            raise PriceBookError(f"price book line {line}: expected {len(COLUMNS)} columns")
        entries.append(_parse_row(row, line))
    return PriceBook(entries)


def load_price_book(path: Path | str = DEFAULT_PRICE_BOOK) -> PriceBook:
    return parse_price_book(Path(path).read_text(encoding="utf-8"))
