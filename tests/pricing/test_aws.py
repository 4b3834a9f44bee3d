"""AWS spot price history through boto3's paginator, against moto (and a proxy
that pages moto's answer as EC2 does and adds rows moto cannot make)."""

from __future__ import annotations

import datetime as dt
import logging
from decimal import Decimal

import pytest

from respawn_server.jobs.models import PriceQuote
from respawn_server.jobs.money.refreshers import refresh
from respawn_server.jobs.tasks import refresh_prices
from tests.pricing.spot_history_proxy import SpotHistoryProxy

pytestmark = pytest.mark.django_db

BOOK_TYPES = {"g5.xlarge", "g5.12xlarge", "g5.48xlarge", "g6.xlarge", "g6.12xlarge", "p3.2xlarge", "p3.8xlarge",
              "p3.16xlarge", "p4d.24xlarge", "p5.48xlarge", "r5.16xlarge"}
MOTO_DAY = dt.datetime(2006, 1, 2, 15, 4, 5, tzinfo=dt.timezone.utc)  # moto's placeholder timestamp


def history_row(zone: str, instance_type: str, price: str, when: str, product: str = "Linux/UNIX") -> dict:
    return {"availabilityZone": zone, "instanceType": instance_type, "productDescription": product,
            "spotPrice": price, "timestamp": when}


@pytest.fixture
def ec2(moto, moto_url, aws_keys, price_settings):
    with SpotHistoryProxy(moto_url) as proxy:
        price_settings(aws_endpoint_url=proxy.endpoint, aws_page_size=20)
        yield proxy


def moto_quotes():
    return PriceQuote.objects.filter(provider="aws", observed_at=MOTO_DAY)


def test_it_asks_for_linux_spot_history_of_the_price_books_types_in_each_region(moto, moto_url, aws_keys,
                                                                                 price_settings):
    price_settings(aws_endpoint_url=moto_url)

    result = refresh_prices("aws")

    calls = moto.calls("DescribeSpotPriceHistory")
    assert len(calls) == 2  # us-east-1 and us-west-2, each one page (moto never pages)
    for call in calls:
        assert {v for k, v in call.items() if k.startswith("InstanceType.")} == BOOK_TYPES
        assert {v for k, v in call.items() if k.startswith("ProductDescription.")} == {
            "Linux/UNIX", "Linux/UNIX (Amazon VPC)"}
        assert "StartTime" in call
    quotes = moto_quotes()
    assert result == quotes.count() > 0
    assert set(quotes.values_list("region", flat=True)) == {"us-east-1", "us-west-2"}
    for quote in quotes:
        assert quote.market == "spot" and quote.zone.startswith(quote.region) and quote.zone != quote.region
        assert quote.instance_type in BOOK_TYPES
        assert quote.usd_per_hour == Decimal("0.00001")
        assert quote.source == "aws DescribeSpotPriceHistory"


def test_running_twice_adds_nothing_and_keeps_the_shipped_book(moto, moto_url, aws_keys, price_settings):
    price_settings(aws_endpoint_url=moto_url)
    book = PriceQuote.objects.count()
    added = refresh("aws").added
    assert added > 0

    again = refresh("aws")

    assert again.added == 0 and again.seen == added
    assert PriceQuote.objects.count() == book + added


def test_it_walks_every_page_and_keeps_each_price_change_at_its_own_time(ec2):
    ec2.extra_rows += [
        history_row("us-east-1a", "p4d.24xlarge", "10.815000", "2026-11-01T00:00:00.000Z"),
        history_row("us-east-1a", "p4d.24xlarge", "11.902100", "2026-11-01T06:30:00.000Z"),
    ]

    result = refresh("aws")

    east = [p for p in ec2.pages_served if p.get("MaxResults")]
    assert len(east) > 2 and [p.get("NextToken") for p in east[:2]] == [None, "20"]  # boto3 followed the tokens
    prices = list(PriceQuote.objects.filter(provider="aws", zone="us-east-1a", instance_type="p4d.24xlarge",
                                            observed_at__year=2026).values_list("observed_at", "usd_per_hour"))
    assert prices == [(dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc), Decimal("10.81500")),
                      (dt.datetime(2026, 11, 1, 6, 30, tzinfo=dt.timezone.utc), Decimal("11.90210"))]
    assert result.added == moto_quotes().count() + 2


def test_a_bad_row_is_skipped_with_a_log_line_naming_it_and_the_rest_is_kept(ec2, caplog):
    ec2.extra_rows += [
        history_row("us-east-1a", "g5.xlarge", "not-a-price", "2026-11-02T00:00:00.000Z"),
        history_row("us-east-1c", "g5.xlarge", "-0.3", "2026-11-02T00:00:00.000Z"),
        history_row("us-east-1a", "g5.xlarge", "0.3310", "2026-11-03T00:00:00.000Z"),
        history_row("us-east-1a", "g5.xlarge", "0.9", "2026-11-03T00:00:00.000Z", product="Windows"),
    ]

    with caplog.at_level(logging.WARNING, logger="respawn_server.jobs.money.refreshers"):
        refresh("aws")

    skipped = [r.getMessage() for r in caplog.records if "skipped row" in r.getMessage()]
    assert len(skipped) == 2
    assert "not-a-price" in skipped[0] and "us-east-1a" in skipped[0] and "SpotPrice" in skipped[0]
    assert "-0.3" in skipped[1] and "us-east-1c" in skipped[1]
    new = PriceQuote.objects.filter(provider="aws", observed_at__year=2026)
    assert list(new.values_list("zone", "usd_per_hour")) == [("us-east-1a", Decimal("0.33100"))]


def test_an_older_quote_is_never_overwritten_by_a_later_refresh(ec2):
    ec2.extra_rows.append(history_row("us-west-2b", "g6.xlarge", "0.2817", "2026-11-05T00:00:00.000Z"))
    refresh("aws")
    ec2.extra_rows[-1] = history_row("us-west-2b", "g6.xlarge", "0.3000", "2026-11-05T12:00:00.000Z")

    refresh("aws")

    series = PriceQuote.objects.filter(provider="aws", zone="us-west-2b", instance_type="g6.xlarge",
                                       observed_at__year=2026).order_by("observed_at")
    assert [q.usd_per_hour for q in series] == [Decimal("0.28170"), Decimal("0.30000")]
