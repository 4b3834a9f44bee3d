"""Where a job's next VMs go: the cheapest allowed (cloud, region, zone, type,
market) by the price in force, skipping placements on back-off.

Reads the database and hands plain values to the pure policy code; a later
issue makes the choice learn (jobs/policies)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.utils import timezone

from jobs.models import Job, PlacementBackoff, PriceQuote
from jobs.providers.base import Market, Placement


@dataclass(frozen=True)
class PricedPlacement:
    placement: Placement
    usd_per_hour: Decimal


def market_for(job: Job) -> str:
    if job.on_demand_after_preemptions is not None and job.preemptions >= job.on_demand_after_preemptions:
        return Market.ON_DEMAND
    return Market.SPOT


def candidates(job: Job, market: str, now=None) -> list[PricedPlacement]:
    """Allowed placements with their current price, cheapest first."""
    now = now or timezone.now()
    enabled = settings.RESPAWN["PROVIDERS"]
    clouds = [c for c in (job.allowed_clouds or enabled) if c in enabled]
    quotes = PriceQuote.objects.filter(provider__in=clouds, market=market, observed_at__lte=now)
    if job.instance_types:
        quotes = quotes.filter(instance_type__in=job.instance_types)
    if job.allowed_regions:
        quotes = quotes.filter(region__in=job.allowed_regions)
    latest: dict[tuple, PriceQuote] = {}
    for quote in quotes.order_by("observed_at"):
        latest[(quote.provider, quote.region, quote.zone, quote.instance_type)] = quote
    blocked = {
        (b.provider, b.region, b.zone, b.instance_type)
        for b in PlacementBackoff.objects.filter(until__gt=now, market=market)
    }
    priced = []
    for (provider, region, zone, instance_type), quote in latest.items():
        placement = Placement(provider=provider, region=region, zone=zone or default_zone(provider, region),
                              instance_type=instance_type, market=market)
        too_dear = job.max_price_per_hour is not None and quote.usd_per_hour > job.max_price_per_hour
        if not too_dear and (provider, region, placement.zone, instance_type) not in blocked:
            priced.append(PricedPlacement(placement, quote.usd_per_hour))
    return sorted(priced, key=lambda c: (c.usd_per_hour, c.placement.provider, c.placement.zone))


def default_zone(provider: str, region: str) -> str:
    """A region-wide quote is placed in the region's first zone."""
    return {"aws": f"{region}a", "gcp": f"{region}-a", "azure": "1"}.get(provider, region)


def back_off(placement: Placement, reason: str, *, seconds: float | None = None) -> None:
    seconds = settings.RESPAWN["PLACEMENT_BACKOFF_S"] if seconds is None else seconds
    PlacementBackoff.objects.create(
        provider=placement.provider, region=placement.region, zone=placement.zone,
        instance_type=placement.instance_type, market=placement.market,
        until=timezone.now() + timedelta(seconds=seconds), reason=reason[:300],
    )
