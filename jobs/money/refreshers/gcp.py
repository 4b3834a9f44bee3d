"""GCP: the Cloud Billing Catalog's Compute Engine SKUs, composed into machine prices.

Google prices a VM by its parts: each vCPU and GiB of memory of its family
(e.g. "A2 Instance Core running in Americas") and each GPU ("Nvidia Tesla A100
GPU running in Americas"), on demand (usageType OnDemand) or Spot (Preemptible).
A machine type's hourly price is vCPUs × core + memory × RAM + GPUs × GPU.

What this leaves out, so the result is an approximation of the bill:
- memory: machine-type tables give "GB", the SKU charges per GiB; we count the
  table's number as GiB, as Google's own calculator does;
- local SSD bundled with some types (a3-highgpu-8g's 6 TB), boot disk, network;
- sustained- and committed-use discounts (on-demand list price only);
- tiered rates: the first tier (from zero usage) is the price.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal

import requests

from respawn_server.jobs.money.prices import Quote
from respawn_server.jobs.money.refreshers.config import RefreshConfig
from respawn_server.jobs.money.refreshers.quotes import (BadRow, PriceRefreshError, decode_json_object, field, fitting,
                                                         hourly_price, skip_bad_row, utc_timestamp)

SOURCE = "gcp billing catalog"
COMPUTE_ENGINE_SERVICE = "6F81-5844-456A"
MARKETS = {"OnDemand": "on_demand", "Preemptible": "spot"}
# The unit each kind of part is charged in.
UNITS = {"core": "h", "ram": "GiBy.h", "gpu": "h"}


@dataclass(frozen=True, slots=True)
class Machine:
    family: str
    """The SKU descriptions' family prefix: "A2" in "A2 Instance Core running in ..."."""
    vcpus: int
    memory_gib: int
    gpu: str = ""
    """The SKU descriptions' GPU name: "Tesla A100" in "Nvidia Tesla A100 GPU running in ..."."""
    gpus: int = 0


# From Google's machine-type tables: https://cloud.google.com/compute/docs/gpus (A2, G2),
# https://cloud.google.com/compute/docs/accelerator-optimized-machines#a3-vms (A3),
# https://cloud.google.com/compute/docs/general-purpose-machines#c3_machine_types (C3).
MACHINES = {
    "a2-highgpu-1g": Machine("A2", 12, 85, "Tesla A100", 1),
    "a2-highgpu-8g": Machine("A2", 96, 680, "Tesla A100", 8),
    "g2-standard-4": Machine("G2", 4, 16, "L4", 1),
    "g2-standard-48": Machine("G2", 48, 192, "L4", 4),
    "a3-highgpu-8g": Machine("A3", 208, 1872, "H100 80GB", 8),
    "c3-highcpu-88": Machine("C3", 88, 176),
}

_MARKET_PREFIX = r"^(?:Spot Preemptible |Preemptible )?"
_INSTANCE_PART = re.compile(_MARKET_PREFIX + r"(?P<family>[A-Z][A-Z0-9]*) Instance (?P<part>Core|Ram) running in ")
_GPU_PART = re.compile(_MARKET_PREFIX + r"Nvidia (?P<gpu>.+?) GPU running in ")


@dataclass(frozen=True, slots=True)
class PartPrice:
    """One SKU in one region: e.g. ("core", "A2") on demand in us-central1."""
    region: str
    market: str
    part: tuple[str, str]
    usd_per_unit: Decimal
    effective: dt.datetime


def catalog_quotes(wanted: dict[str, set[str]], config: RefreshConfig) -> Iterator[Quote]:
    parts: dict[tuple, PartPrice] = {}
    for page in _pages(config):
        for price in parse_page(page, set(wanted)):
            parts[(price.region, price.market, price.part)] = price
    for region, types in sorted(wanted.items()):
        for instance_type in sorted(types):
            yield from compose(region, instance_type, parts)


def _pages(config: RefreshConfig) -> Iterator[dict]:
    url = f"{config.gcp_billing_url.rstrip('/')}/v1/services/{COMPUTE_ENGINE_SERVICE}/skus"
    headers = {"X-Goog-Api-Key": config.gcp_api_key} if config.gcp_api_key else {}
    token = ""
    for _ in range(config.max_pages):
        params = {"currencyCode": "USD", "pageSize": 5000, **({"pageToken": token} if token else {})}
        try:
            answer = requests.get(url, params=params, headers=headers, timeout=config.timeout_s)
            answer.raise_for_status()
        except requests.RequestException as exc:
            raise PriceRefreshError(f"{SOURCE}: GET {url} failed: {exc}") from exc
        page = decode_json_object(answer.text, SOURCE)
        yield page
        token = page.get("nextPageToken")
        if not token:
            return
        if not isinstance(token, str):
            raise PriceRefreshError(f"{SOURCE}: nextPageToken must be a string (got {token!r:.80})")
    raise PriceRefreshError(f"{SOURCE}: more than {config.max_pages} pages; raise RESPAWN_PRICE_MAX_PAGES")


def parse_page(page: dict, regions: set[str]) -> Iterator[PartPrice]:
    skus = page.get("skus", [])  # Google leaves out an empty list
    if not isinstance(skus, list):
        raise PriceRefreshError(f"{SOURCE}: 'skus' must be a list (got {type(skus).__name__})")
    for sku in skus:
        try:
            yield from parse_sku(sku, regions)
        except BadRow as exc:
            skip_bad_row(SOURCE, sku, exc)


def parse_sku(sku: object, regions: set[str]) -> list[PartPrice]:
    """The SKU's price in each wanted region; [] for a SKU that is no machine part
    we compose (commitments, sole tenancy, disks, other families...)."""
    description = field(sku, "description", str)
    market = MARKETS.get(field(field(sku, "category", dict), "usageType", str))
    part = _part(description)
    if market is None or part is None:
        return []
    in_regions = [r for r in field(sku, "serviceRegions", list) if isinstance(r, str) and r in regions]
    if not in_regions:
        return []
    info = field(sku, "pricingInfo", list)
    if not info:
        raise BadRow("empty 'pricingInfo'")
    expression = field(info[0], "pricingExpression", dict)
    if field(expression, "usageUnit", str) != UNITS[part[0]]:
        raise BadRow(f"usageUnit {expression['usageUnit']!r} is not {UNITS[part[0]]!r} for a {part[0]}")
    price = _first_tier_price(field(expression, "tieredRates", list))
    effective = utc_timestamp(field(info[0], "effectiveTime", str), "effectiveTime")
    return [PartPrice(r, market, part, price, effective) for r in in_regions]


def _part(description: str) -> tuple[str, str] | None:
    if match := _INSTANCE_PART.match(description):
        return (match["part"].lower(), match["family"])
    if match := _GPU_PART.match(description):
        return ("gpu", match["gpu"])
    return None


def _first_tier_price(tiers: list) -> Decimal:
    for tier in tiers:
        # Google's JSON may leave out a zero, as protobuf's JSON form does.
        start = field(tier, "startUsageAmount", (int, float)) if isinstance(tier, dict) and "startUsageAmount" in tier else 0
        if start == 0:
            money = field(tier, "unitPrice", dict)
            if money.get("currencyCode", "USD") != "USD":
                raise BadRow(f"unitPrice currency {money['currencyCode']!r:.20} is not USD")
            units = field(money, "units", (str, int)) if "units" in money else 0
            nanos = field(money, "nanos", int) if "nanos" in money else 0
            try:
                whole = int(units)
            except ValueError:
                raise BadRow(f"unitPrice units {units!r:.40} is not a whole number") from None
            if not -10**9 < nanos < 10**9:
                raise BadRow(f"unitPrice nanos {nanos} is out of range")
            # A part price may be below PriceQuote's five places (a GiB of RAM); round only the machine's sum.
            return Decimal(whole) + Decimal(nanos) / Decimal(10**9)
    raise BadRow("no tieredRates entry from zero usage")


def compose(region: str, instance_type: str, parts: dict[tuple, PartPrice]) -> Iterator[Quote]:
    machine = MACHINES.get(instance_type)
    if machine is None:
        skip_bad_row(SOURCE, instance_type, BadRow("no vCPU/memory/GPU table entry to compose its price from"))
        return
    needs = [(("core", machine.family), machine.vcpus), (("ram", machine.family), machine.memory_gib)]
    if machine.gpus:
        needs.append((("gpu", machine.gpu), machine.gpus))
    for market in MARKETS.values():
        found = [(parts.get((region, market, part)), count) for part, count in needs]
        missing = [part for (price, _), (part, _) in zip(found, needs) if price is None]
        if missing:
            skip_bad_row(SOURCE, f"{instance_type} {market} in {region}",
                         BadRow(f"no catalog price for {', '.join(' '.join(p) for p in missing)}"))
            continue
        total = sum((price.usd_per_unit * count for price, count in found), Decimal(0))
        try:
            yield fitting(Quote(
                provider="gcp", region=region, zone="", instance_type=instance_type, market=market,
                usd_per_hour=hourly_price(total, "composed price"),
                # The machine's price changed when its last part's price did.
                observed_at=max(price.effective for price, _ in found),
                source=(f"{SOURCE}: {machine.vcpus} vCPU + {machine.memory_gib} GiB"
                        + (f" + {machine.gpus} {machine.gpu}" if machine.gpus else "")
                        + " (approximate: list price of the parts; no disks, discounts or bundled SSD)"),
            ))
        except BadRow as exc:
            skip_bad_row(SOURCE, f"{instance_type} {market} in {region}", exc)
