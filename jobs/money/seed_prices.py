"""The price book in the database: PriceQuote rows seeded from the shipped file, and
DiskPriceQuote rows from the shipped disk prices."""

from __future__ import annotations

from respawn_server.jobs.money.pricebook import PriceBook, load_disk_prices, load_price_book
from respawn_server.jobs.money.prices import DiskQuote
from respawn_server.jobs.money.refreshers.quotes import store_quotes


def seed_price_book(book: PriceBook | None = None, disks: list[DiskQuote] | None = None) -> int:
    """Insert the shipped quotes (VM and disk) not yet present; returns how many were new.
    Safe to run on every migrate: a quote is keyed by where, what and when."""
    book = book or load_price_book()
    disks = load_disk_prices() if disks is None else disks
    return store_quotes([*book.entries, *disks])
