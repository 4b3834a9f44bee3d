"""A price quote: what one source said a VM type, or a managed disk, cost from a moment on.

One plain type for each, no Django: the shipped price book reads them from its files
(`pricebook`), the refreshers from the clouds' price APIs (`refreshers`), costs from the
database, and the ledger prices seconds with them. The tables PriceQuote and
DiskPriceQuote (respawn_server.jobs.models) are their stored form, one column a field.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal

MARKETS = ("spot", "on_demand")
DISK = "disk"
"""The market of a disk's price key: its price is per month, its key has no zone."""


class QuoteError(ValueError):
    """A quote that cannot be one; the message names its key and the field."""


def _check(quote: Quote | DiskQuote, price: Decimal) -> None:
    if not isinstance(quote.observed_at, dt.datetime) or quote.observed_at.tzinfo is None:
        raise QuoteError(f"quote {quote.key()}: observed_at must be a timezone-aware datetime "
                         f"(got {quote.observed_at!r})")
    if not isinstance(price, Decimal) or not price.is_finite() or price < 0:
        raise QuoteError(f"quote {quote.key()}: the price must be a non-negative Decimal (got {price!r})")


@dataclass(frozen=True, kw_only=True, slots=True)
class Quote:
    """A VM type's price per hour on one market, in a region or one zone of it."""

    provider: str
    region: str
    zone: str
    """Empty: applies to every zone of the region that has no quote of its own."""
    instance_type: str
    market: str
    usd_per_hour: Decimal
    observed_at: dt.datetime
    source: str = ""
    """Where the price was read (a file, an API, a meter), for people."""

    def __post_init__(self) -> None:
        if self.market not in MARKETS:
            raise QuoteError(f"quote {self.key()}: market must be one of {MARKETS}")
        _check(self, self.usd_per_hour)

    def key(self) -> tuple[str, str, str, str, str]:
        """What is priced, and where: the quotes of one key are one price over time."""
        return (self.provider, self.region, self.zone, self.instance_type, self.market)

    @property
    def rate(self) -> Decimal:
        """The price per its unit of time (here an hour)."""
        return self.usd_per_hour


@dataclass(frozen=True, kw_only=True, slots=True)
class DiskQuote:
    """A managed disk's list price per month in one region (DESIGN §8: a stopped VM's disk;
    disks have no zone price)."""

    provider: str
    region: str
    sku: str
    """The cloud's price name of the disk, e.g. Azure's "P10 LRS"."""
    usd_per_month: Decimal
    observed_at: dt.datetime
    source: str = ""

    def __post_init__(self) -> None:
        _check(self, self.usd_per_month)

    def key(self) -> tuple[str, str, str, str, str]:
        """Shaped as a VM quote's key, so both kinds share one index (respawn_server.jobs.money.ledger)."""
        return (self.provider, self.region, "", self.sku, DISK)

    @property
    def rate(self) -> Decimal:
        """The price per its unit of time (here a month)."""
        return self.usd_per_month
