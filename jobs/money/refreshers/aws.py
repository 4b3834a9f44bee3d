"""AWS: EC2 spot price history, one paged DescribeSpotPriceHistory per region.

Each history row is a price that took effect at its Timestamp in one availability
zone. Only Linux prices are kept: the price book and our AMIs are Linux.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from respawn_server.jobs.money.prices import Quote
from respawn_server.jobs.money.refreshers.config import RefreshConfig
from respawn_server.jobs.money.refreshers.quotes import (BadRow, PriceRefreshError, as_utc, field, fitting, hourly_price,
                                                         skip_bad_row)

SOURCE = "aws DescribeSpotPriceHistory"
# "Linux/UNIX (Amazon VPC)" is the same price under EC2-Classic's old name (moto still says it).
LINUX = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")


def spot_quote_pages(region: str, instance_types: set[str], config: RefreshConfig,
                     now: dt.datetime) -> Iterator[list[Quote]]:
    client = boto3.session.Session().client("ec2", region_name=region, endpoint_url=config.aws_endpoint_url,
                          config=Config(retries={"mode": "standard"}, connect_timeout=config.timeout_s,
                                        read_timeout=config.timeout_s))
    pages = client.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=sorted(instance_types),
        ProductDescriptions=list(LINUX),
        StartTime=now - dt.timedelta(hours=config.aws_lookback_h),
        PaginationConfig={"PageSize": config.aws_page_size},
    )
    try:
        for number, page in enumerate(pages, start=1):
            if number > config.max_pages:
                raise PriceRefreshError(f"{SOURCE} in {region}: more than {config.max_pages} pages; "
                                        "raise RESPAWN_PRICE_MAX_PAGES or shorten RESPAWN_AWS_PRICE_LOOKBACK_H")
            yield list(parse_page(page, region))
    except (ClientError, BotoCoreError) as exc:
        raise PriceRefreshError(f"{SOURCE} in {region} failed: {exc}") from exc


def parse_page(page: object, region: str) -> Iterator[Quote]:
    rows = page.get("SpotPriceHistory") if isinstance(page, dict) else None
    if not isinstance(rows, list):
        raise PriceRefreshError(f"{SOURCE} in {region}: a page without a SpotPriceHistory list")
    for row in rows:
        try:
            quote = parse_row(row, region)
        except BadRow as exc:
            skip_bad_row(f"{SOURCE} in {region}", row, exc)
            continue
        if quote is not None:
            yield quote


def parse_row(row: object, region: str) -> Quote | None:
    """The row's quote; None for a product we do not price (Windows, SUSE, ...)."""
    if field(row, "ProductDescription", str) not in LINUX:
        return None
    zone = field(row, "AvailabilityZone", str)
    if not zone.startswith(region):
        raise BadRow(f"zone {zone!r} is not in region {region!r}")
    return fitting(Quote(
        provider="aws", region=region, zone=zone, instance_type=field(row, "InstanceType", str), market="spot",
        usd_per_hour=hourly_price(field(row, "SpotPrice", str), "SpotPrice"),
        observed_at=as_utc(field(row, "Timestamp", dt.datetime), "Timestamp"), source=SOURCE,
    ))
