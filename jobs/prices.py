"""The price book in the database: PriceQuote rows seeded from the shipped file."""

from __future__ import annotations

import datetime as dt

from jobs.models import PriceQuote
from jobs.pricebook import PriceBook, load_price_book


def seed_price_book(book: PriceBook | None = None) -> int:
    """Insert the shipped quotes not yet present; returns how many were new.
    Safe to run on every migrate: a quote is keyed by where, what and when."""
    book = book or load_price_book()
    rows = [
        PriceQuote(
            provider=e.provider, region=e.region, zone=e.zone, instance_type=e.instance_type, market=e.market,
            usd_per_hour=e.usd_per_hour, source=e.source,
            observed_at=dt.datetime.combine(e.as_of, dt.time(), tzinfo=dt.timezone.utc),
        )
        for e in book.entries
    ]
    before = PriceQuote.objects.count()
    PriceQuote.objects.bulk_create(rows, ignore_conflicts=True)
    return PriceQuote.objects.count() - before
