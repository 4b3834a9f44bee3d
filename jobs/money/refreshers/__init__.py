"""Price refreshers: fetch the clouds' current prices into PriceQuote (and Azure's
managed disk prices into DiskPriceQuote).

One refresher per cloud that publishes prices (`REFRESHERS`); each asks only for
the regions and instance types the database already prices (the shipped price
book at least), Azure's also for its OS disk tiers in those regions (the
configured tier, and those already priced or kept by instances), and inserts
every new quote, never changing an old one, so the cost ledger can use the
price in force at each moment.

    refresh("azure")  ->  RefreshResult(provider="azure", seen=16, added=16)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from django.utils import timezone

from respawn_server.jobs.money.prices import Quote
from respawn_server.jobs.money.refreshers.config import RefreshConfig
from respawn_server.jobs.money.refreshers.quotes import PriceRefreshError, priced_disks, priced_types, store_quotes

__all__ = ["REFRESHERS", "PriceRefreshError", "RefreshConfig", "RefreshResult", "refresh"]

log = logging.getLogger(__name__)
REFRESHERS = ("aws", "azure", "gcp")


@dataclass(frozen=True, slots=True)
class RefreshResult:
    provider: str
    seen: int
    """Quotes read from the cloud (bad rows not counted; they are logged)."""
    added: int
    """Of those, quotes not stored before."""


def refresh(provider: str, config: RefreshConfig | None = None) -> RefreshResult:
    if provider not in REFRESHERS:
        raise ValueError(f"no price refresher for {provider!r}; there are: {', '.join(REFRESHERS)}")
    config = config or RefreshConfig.from_settings()
    wanted = priced_types(provider)
    if not wanted:
        log.info("no %s instance types in the price book: nothing to refresh", provider)
        return RefreshResult(provider, 0, 0)
    seen = added = 0
    for batch in _batches(provider, wanted, config):
        seen += len(batch)
        added += store_quotes(batch)
    log.info("%s prices refreshed: %d quotes read, %d new", provider, seen, added)
    return RefreshResult(provider, seen, added)


def _batches(provider: str, wanted: dict[str, set[str]], config: RefreshConfig):
    """Lists of quotes, each stored before the next is fetched: a failure on a later
    page or region keeps what was already read (each quote is true on its own).
    GCP's come in one list: a machine's price needs parts from any page."""
    if provider == "aws":
        from respawn_server.jobs.money.refreshers.aws import spot_quote_pages

        now = timezone.now()
        for region, types in sorted(wanted.items()):
            yield from spot_quote_pages(region, types, config, now)
    elif provider == "azure":
        from respawn_server.jobs.money.refreshers.azure import disk_quote_pages, retail_quote_pages

        yield from retail_quote_pages(wanted, config)
        yield from disk_quote_pages(set(wanted), priced_disks("azure") | {_configured_azure_disk()}, config)
    else:
        from respawn_server.jobs.money.refreshers.gcp import catalog_quotes

        yield _changed(_in_known_zones(list(catalog_quotes(wanted, config))))


def _configured_azure_disk() -> str:
    """The price SKU of the OS disk this deployment's Azure VMs get (AzureConfig.os_disk_tier)."""
    from django.conf import settings

    from respawn_server.jobs.fleet.providers.azure import DEFAULT_OS_DISK_TIER, os_disk_price_sku

    config = settings.RESPAWN["PROVIDER_CONFIG"].get("azure", {})
    return os_disk_price_sku(config.get("os_disk_tier", DEFAULT_OS_DISK_TIER))


def _in_known_zones(quotes: list[Quote]) -> list[Quote]:
    """Each region-wide quote again for every zone the database prices that type in:
    Google's price is the same in every zone of a region, and a zone's own (older)
    row would otherwise win over a newer region-wide one (DESIGN §8's look-up)."""
    from respawn_server.jobs.models import PriceQuote

    zones: dict[tuple, set[str]] = {}
    for region, instance_type, market, zone in (PriceQuote.objects.filter(provider="gcp").exclude(zone="")
                                                .values_list("region", "instance_type", "market", "zone")
                                                .distinct()):
        zones.setdefault((region, instance_type, market), set()).add(zone)
    return quotes + [replace(q, zone=zone) for q in quotes
                     for zone in sorted(zones.get((q.region, q.instance_type, q.market), ()))]


def _changed(quotes: list[Quote]) -> list[Quote]:
    """Composed GCP quotes whose price differs from the latest stored one: the
    catalog's effectiveTime moves with every fetch even when no price does."""
    from respawn_server.jobs.models import PriceQuote

    kept = []
    for quote in quotes:
        latest = (PriceQuote.objects.filter(provider=quote.provider, region=quote.region, zone=quote.zone,
                                            instance_type=quote.instance_type, market=quote.market,
                                            observed_at__lte=quote.observed_at)
                  .order_by("-observed_at").values_list("usd_per_hour", flat=True).first())
        if latest != quote.usd_per_hour:
            kept.append(quote)
    return kept
