"""The price book in the database: PriceQuote rows seeded from the shipped file, and
DiskPriceQuote rows from the shipped disk prices."""

from __future__ import annotations

import datetime as dt

from respawn_server.jobs.models import DiskPriceQuote, PriceQuote
from respawn_server.jobs.money.pricebook import DiskPriceEntry, PriceBook, load_disk_prices, load_price_book


def seed_price_book(book: PriceBook | None = None, disks: list[DiskPriceEntry] | None = None) -> int:
    """Insert the shipped quotes (VM and disk) not yet present; returns how many were new.
    Safe to run on every migrate: a quote is keyed by where, what and when."""
    book = book or load_price_book()
    disks = load_disk_prices() if disks is None else disks
    return _insert(PriceQuote, [
        PriceQuote(
            provider=e.provider, region=e.region, zone=e.zone, instance_type=e.instance_type, market=e.market,
            usd_per_hour=e.usd_per_hour, source=e.source, observed_at=_midnight(e.as_of),
        )
        for e in book.entries
    ]) + _insert(DiskPriceQuote, [
        DiskPriceQuote(provider=e.provider, region=e.region, sku=e.sku, usd_per_month=e.usd_per_month,
                       source=e.source, observed_at=_midnight(e.as_of))
        for e in disks
    ])


def _midnight(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(), tzinfo=dt.timezone.utc)


def _insert(model, rows: list) -> int:
    before = model.objects.count()
    model.objects.bulk_create(rows, ignore_conflicts=True)
    return model.objects.count() - before
