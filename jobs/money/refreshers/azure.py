"""Azure: the Retail Prices API, paged by its NextPageLink.

The API lists every meter of a VM size: pay-as-you-go and Spot, Linux and
Windows, the retired Low Priority, reservations and Dev/Test. Two of them are
prices we pay for a Linux VM: pay-as-you-go (on_demand) and Spot (spot). A
meter's kind shows only in its names: "Spot" / "Low Priority" in meterName,
"Windows" in productName. Prices are per region (zone "").

Managed disks are listed under serviceName "Storage": a tier's monthly price is
the meter "<skuName> Disk" (e.g. skuName "P10 LRS", meterName "P10 LRS Disk",
unitOfMeasure "1/Month"); the same tier's other meters (mount, operations,
bursting) are not what a stopped VM's disk costs. They are kept per month
(DiskPriceQuote); the ledger prorates them by the second.
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import requests

from respawn_server.jobs.money.prices import DiskQuote, Quote
from respawn_server.jobs.money.refreshers.config import RefreshConfig
from respawn_server.jobs.money.refreshers.quotes import (BadRow, PriceRefreshError, decode_json_object, field, fitting,
                                                         hourly_price, monthly_price, skip_bad_row, utc_timestamp)

SOURCE = "azure retail prices"


def price_filter(wanted: dict[str, set[str]]) -> str:
    """OData $filter for the VM sizes and regions asked for (the API knows `eq`,
    `and`, `or`; not `in`)."""
    regions = " or ".join(f"armRegionName eq {_literal(r)}" for r in sorted(wanted))
    sizes = " or ".join(f"armSkuName eq {_literal(t)}" for t in sorted(set().union(*wanted.values())))
    return f"serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and ({regions}) and ({sizes})"


def disk_filter(regions: set[str], skus: set[str]) -> str:
    """OData $filter for the managed disk tiers (skuName, e.g. 'P10 LRS') in the regions asked for."""
    where = " or ".join(f"armRegionName eq {_literal(r)}" for r in sorted(regions))
    tiers = " or ".join(f"skuName eq {_literal(s)}" for s in sorted(skus))
    return f"serviceName eq 'Storage' and priceType eq 'Consumption' and ({where}) and ({tiers})"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"  # OData doubles a quote inside a string


def retail_quote_pages(wanted: dict[str, set[str]], config: RefreshConfig) -> Iterator[list[Quote]]:
    for page in _pages(price_filter(wanted), config):
        yield [q for q in parse_page(page) if q.instance_type in wanted.get(q.region, ())]


def disk_quote_pages(regions: set[str], skus: set[str], config: RefreshConfig) -> Iterator[list[DiskQuote]]:
    for page in _pages(disk_filter(regions, skus), config):
        yield [q for q in parse_page(page, parse_disk_item) if q.region in regions and q.sku in skus]


def _pages(odata_filter: str, config: RefreshConfig) -> Iterator[dict]:
    url, params = config.azure_prices_url, {"$filter": odata_filter}
    for _ in range(config.max_pages):
        page = _get_page(url, params, config)
        yield page
        link = page.get("NextPageLink")
        if not link:
            return
        if not isinstance(link, str) or _origin(link) != _origin(config.azure_prices_url):
            raise PriceRefreshError(f"{SOURCE}: NextPageLink {link!r:.200} does not lead back to "
                                    f"{config.azure_prices_url}")
        url, params = link, None  # the link carries the filter and the skip
    raise PriceRefreshError(f"{SOURCE}: more than {config.max_pages} pages; raise RESPAWN_PRICE_MAX_PAGES")


def _origin(url: str) -> tuple:
    # Azure's links name the port (https://prices.azure.com:443/...); the configured URL usually does not.
    parts = urlsplit(url)
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return (parts.scheme, parts.hostname, None)
    return (parts.scheme, parts.hostname, port)


def _get_page(url: str, params: dict | None, config: RefreshConfig) -> dict:
    try:
        answer = requests.get(url, params=params, timeout=config.timeout_s)
        answer.raise_for_status()
    except requests.RequestException as exc:
        raise PriceRefreshError(f"{SOURCE}: GET {url} failed: {exc}") from exc
    return decode_json_object(answer.text, SOURCE)


def parse_page(page: dict, parse=None) -> Iterator[Quote | DiskQuote]:
    """The page's quotes, each item read by `parse` (VM meters: `parse_item`)."""
    parse = parse or parse_item
    items = page.get("Items")
    if not isinstance(items, list):
        raise PriceRefreshError(f"{SOURCE}: a page without an Items list")
    for item in items:
        try:
            quote = parse(item)
        except BadRow as exc:
            skip_bad_row(SOURCE, item, exc)
            continue
        if quote is not None:
            yield quote


def parse_item(item: object) -> Quote | None:
    """The item's quote; None for a meter that is not Linux pay-as-you-go or Spot."""
    meter = field(item, "meterName", str)
    if (field(item, "type", str) != "Consumption" or "Windows" in field(item, "productName", str)
            or "Low Priority" in meter):
        return None
    if field(item, "unitOfMeasure", str) != "1 Hour":
        raise BadRow(f"unitOfMeasure {item['unitOfMeasure']!r} is not '1 Hour'")
    if field(item, "currencyCode", str) != "USD":
        raise BadRow(f"currencyCode {item['currencyCode']!r} is not 'USD'")
    return fitting(Quote(
        provider="azure", region=field(item, "armRegionName", str), zone="",
        instance_type=field(item, "armSkuName", str), market="spot" if "Spot" in meter else "on_demand",
        usd_per_hour=hourly_price(field(item, "retailPrice", (int, float, str)), "retailPrice"),
        observed_at=utc_timestamp(field(item, "effectiveStartDate", str), "effectiveStartDate"),
        source=f"{SOURCE} meter {meter!r}"[:300],
    ))


def parse_disk_item(item: object) -> DiskQuote | None:
    """The item's monthly price of a managed disk tier; None for the tier's other meters."""
    sku = field(item, "skuName", str)
    meter = field(item, "meterName", str)
    if field(item, "type", str) != "Consumption" or meter != f"{sku} Disk":
        return None
    if field(item, "unitOfMeasure", str) != "1/Month":
        raise BadRow(f"unitOfMeasure {item['unitOfMeasure']!r} is not '1/Month'")
    if field(item, "currencyCode", str) != "USD":
        raise BadRow(f"currencyCode {item['currencyCode']!r} is not 'USD'")
    return fitting(DiskQuote(
        provider="azure", region=field(item, "armRegionName", str), sku=sku,
        usd_per_month=monthly_price(field(item, "retailPrice", (int, float, str)), "retailPrice"),
        observed_at=utc_timestamp(field(item, "effectiveStartDate", str), "effectiveStartDate"),
        source=f"{SOURCE} meter {meter!r} of {field(item, 'productName', str)!r}"[:300],
    ))
