"""What every refresher shares: the checks on outside values (a quote's among them),
and the insert that keeps every quote ever seen (the shipped price book's too).

Outside data is checked field by field. A row that fails a check is skipped with
one log line naming it (`BadRow`); a page that cannot be read at all stops the
refresh with `PriceRefreshError`. Nothing else may escape a parser.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation

from respawn_server.jobs.models import DiskPriceQuote, Instance, PriceQuote
from respawn_server.jobs.money.prices import DiskQuote, Quote

log = logging.getLogger(__name__)

# PriceQuote.usd_per_hour is DECIMAL(10, 5); DiskPriceQuote.usd_per_month DECIMAL(12, 5).
PRICE_PLACES = Decimal("0.00001")
PRICE_LIMIT = Decimal(10) ** 5
MONTHLY_PRICE_LIMIT = Decimal(10) ** 7
NAME_LIMIT = 50
SOURCE_LIMIT = 300
ROW_REPR_LIMIT = 300  # a garbage row can be huge; its log line should not be


class PriceRefreshError(Exception):
    """A price source answered something that is not a page of prices at all."""


class BadRow(ValueError):
    """One row of a page cannot be used; the message says which field and why."""


def fitting(quote: Quote | DiskQuote) -> Quote | DiskQuote:
    """`quote`, read from outside, once its names fit the quote tables' columns: a value
    beyond them would fail the whole insert."""
    names = ("region", "zone", "instance_type") if isinstance(quote, Quote) else ("region", "sku")
    for name in names:
        value = getattr(quote, name)
        if len(value) > NAME_LIMIT or not value.isprintable():
            raise BadRow(f"{name} {value!r:.80} is not a name of at most {NAME_LIMIT} printable characters")
    if len(quote.source) > SOURCE_LIMIT:
        raise BadRow(f"source is longer than {SOURCE_LIMIT} characters")
    return quote


def skip_bad_row(source: str, row: object, error: BadRow) -> None:
    text = repr(row)
    if len(text) > ROW_REPR_LIMIT:
        text = text[:ROW_REPR_LIMIT] + "…"
    log.warning("%s: skipped row %s: %s", source, text, error)


def decode_json_object(text: str, source: str) -> dict:
    """A page's body as a JSON object, or PriceRefreshError saying what came instead."""
    try:
        page = json.loads(text)
    except (ValueError, RecursionError):
        raise PriceRefreshError(f"{source}: the answer is not JSON (starts with {text[:80]!r})") from None
    if not isinstance(page, dict):
        raise PriceRefreshError(f"{source}: the answer is JSON but not an object (got {type(page).__name__})")
    return page


def field(row: object, name: str, kind: type | tuple[type, ...]):
    """row[name], which must be of `kind` (bool is never a number here)."""
    if not isinstance(row, dict):
        raise BadRow(f"not an object (got {type(row).__name__})")
    if name not in row:
        raise BadRow(f"no {name!r}")
    value = row[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
        raise BadRow(f"{name!r} must be {_kind_name(kind)} (got {value!r:.60})")
    if isinstance(value, str) and not value.strip():
        raise BadRow(f"{name!r} is empty")
    return value


def _as_tuple(kind) -> tuple:
    return kind if isinstance(kind, tuple) else (kind,)


def _kind_name(kind) -> str:
    return " or ".join(k.__name__ for k in _as_tuple(kind))


def hourly_price(value: object, name: str) -> Decimal:
    """A positive USD amount per hour that fits PriceQuote, rounded to its five places."""
    return _price(value, name, PRICE_LIMIT, "per hour")


def monthly_price(value: object, name: str) -> Decimal:
    """A positive USD amount per month that fits DiskPriceQuote, rounded to its five places."""
    return _price(value, name, MONTHLY_PRICE_LIMIT, "per month")


def _price(value: object, name: str, limit: Decimal, unit: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (str, int, float, Decimal)):
        raise BadRow(f"{name} must be a number (got {value!r:.60})")
    try:
        price = Decimal(str(value).strip())
    except InvalidOperation:
        raise BadRow(f"{name} is not a number (got {value!r:.60})") from None
    if not price.is_finite() or price <= 0:
        raise BadRow(f"{name} must be a positive finite number (got {value!r:.60})")
    if price >= limit:
        raise BadRow(f"{name} {price} is beyond {limit} USD {unit}")
    rounded = price.quantize(PRICE_PLACES)
    if rounded == 0:
        raise BadRow(f"{name} {price} rounds to zero at five decimal places")
    return rounded


_FRACTION = re.compile(r"(\.\d{6})\d+")


def utc_timestamp(value: object, name: str) -> dt.datetime:
    """An RFC 3339 time as an aware UTC datetime. Google writes up to nine fractional
    digits; Python reads six, and a microsecond is finer than any price change."""
    if not isinstance(value, str):
        raise BadRow(f"{name} must be a timestamp string (got {value!r:.60})")
    try:
        parsed = dt.datetime.fromisoformat(_FRACTION.sub(r"\1", value.strip()))
    except ValueError:
        raise BadRow(f"{name} is not an ISO 8601 timestamp (got {value!r:.60})") from None
    return as_utc(parsed, name)


def as_utc(value: dt.datetime, name: str) -> dt.datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise BadRow(f"{name} has no time zone (got {value!r:.60})")
    try:
        return value.astimezone(dt.timezone.utc)
    except OverflowError:  # year 1 at +01:00, year 9999 at -01:00
        raise BadRow(f"{name} is out of range in UTC (got {value!r:.60})") from None


def store_quotes(quotes: Iterable[Quote | DiskQuote]) -> int:
    """Insert the quotes (VM and disk) not yet stored; returns how many were new. A quote
    is never updated: the price in force at a past moment must stay what it was."""
    unique: dict[tuple, Quote | DiskQuote] = {}
    for quote in quotes:
        kept = unique.setdefault((*quote.key(), quote.observed_at), quote)
        if kept.rate != quote.rate:
            log.warning("two prices for %s observed at the same time (%s and %s): kept the first",
                        kept.key(), kept.rate, quote.rate)
    by_model: dict[type, list] = {}
    for quote in unique.values():
        row = _row(quote)
        by_model.setdefault(type(row), []).append(row)
    added = 0
    for model, rows in by_model.items():
        before = model.objects.count()
        model.objects.bulk_create(rows, ignore_conflicts=True)
        added += model.objects.count() - before
    return added


def _row(quote: Quote | DiskQuote) -> PriceQuote | DiskPriceQuote:
    """The quote's stored form."""
    if isinstance(quote, Quote):
        return PriceQuote(provider=quote.provider, region=quote.region, zone=quote.zone,
                          instance_type=quote.instance_type, market=quote.market, usd_per_hour=quote.usd_per_hour,
                          observed_at=quote.observed_at, source=quote.source)
    return DiskPriceQuote(provider=quote.provider, region=quote.region, sku=quote.sku,
                          usd_per_month=quote.usd_per_month, observed_at=quote.observed_at, source=quote.source)


def priced_types(provider: str) -> dict[str, set[str]]:
    """region -> instance types the database already prices for this provider (the
    shipped price book at least): the refreshers look these up, nothing more."""
    wanted: dict[str, set[str]] = {}
    rows = PriceQuote.objects.filter(provider=provider).values_list("region", "instance_type").distinct()
    for region, instance_type in rows:
        wanted.setdefault(region, set()).add(instance_type)
    return wanted


def priced_disks(provider: str) -> set[str]:
    """Disk SKUs the database prices or its instances keep for this provider."""
    return (set(DiskPriceQuote.objects.filter(provider=provider).values_list("sku", flat=True).distinct())
            | set(Instance.objects.filter(provider=provider).exclude(stopped_disk_sku="")
                  .values_list("stopped_disk_sku", flat=True).distinct()))
