"""GCP Cloud Billing Catalog: SKUs over several pages composed into machine prices
(vCPUs × core + GiB × RAM + GPUs × GPU) for the price book's types."""

from __future__ import annotations

import datetime as dt
import logging
from decimal import Decimal

import pytest

from respawn_server.jobs.models import PriceQuote
from respawn_server.jobs.money.ledger import PriceIndex
from respawn_server.jobs.money.prices import Quote
from respawn_server.jobs.money.refreshers import PriceRefreshError, refresh
from respawn_server.jobs.tasks import refresh_prices
from tests.emulators.gcp_billing import GcpBillingEmulator, sku

pytestmark = pytest.mark.django_db

LATER = "2026-11-03T10:00:00.123456789Z"  # nine fractional digits, as Google may write them


def a2_on_demand(core, ram, gpu):
    return Decimal(12) * Decimal(core) + Decimal(85) * Decimal(ram) + Decimal(gpu)


@pytest.fixture
def gcp(price_settings):
    with GcpBillingEmulator(page_size=5, api_key="key-1") as emulator:
        emulator.add_family_parts("A2", "us-central1", core=0.031611, ram=0.004237, effective="2026-11-01T00:00:00Z")
        emulator.add_gpu("Tesla A100", "us-central1", on_demand=2.933908, spot=1.02, effective=LATER)
        emulator.add_family_parts("G2", "us-central1", core=0.024988, ram=0.002927, effective="2026-11-01T00:00:00Z")
        emulator.add_gpu("L4", "us-central1", on_demand=0.56004, spot=0.18, effective="2026-11-01T00:00:00Z")
        emulator.add_family_parts("C3", "us-central1", core=0.03398, ram=0.00455, effective="2026-11-01T00:00:00Z")
        emulator.add_family_parts("N2", "us-central1", core=0.031611, ram=0.004237)  # a family we do not price
        price_settings(gcp_billing_url=emulator.endpoint, gcp_api_key="key-1")
        yield emulator


def refreshed(instance_type, region="us-central1", zone=""):
    return dict(PriceQuote.objects.filter(provider="gcp", instance_type=instance_type, region=region, zone=zone,
                                          observed_at__year=2026).values_list("market", "usd_per_hour"))


def test_it_composes_each_machine_from_its_parts_on_both_markets(gcp):
    # a2 ×2, g2 ×2, c3: on demand and spot, in us-central1; spot again in each of the book's two zones there
    assert refresh_prices("gcp") == 10 + 10

    assert refreshed("a2-highgpu-1g")["on_demand"] == a2_on_demand("0.031611", "0.004237", "2.933908").quantize(
        Decimal("0.00001"))  # 3.67339, Google's list price is 3.673385
    spot = Decimal(12) * Decimal("0.0094833") + Decimal(85) * Decimal("0.0012711") + Decimal("1.02")
    assert refreshed("a2-highgpu-1g")["spot"] == spot.quantize(Decimal("0.00001"))
    assert refreshed("a2-highgpu-8g")["on_demand"] == (
        96 * Decimal("0.031611") + 680 * Decimal("0.004237") + 8 * Decimal("2.933908")).quantize(Decimal("0.00001"))
    assert refreshed("g2-standard-4")["on_demand"] == Decimal("0.70682")
    assert refreshed("c3-highcpu-88")["on_demand"] == (88 * Decimal("0.03398") + 176 * Decimal("0.00455")).quantize(
        Decimal("0.00001"))
    quote = PriceQuote.objects.get(provider="gcp", instance_type="a2-highgpu-1g", market="on_demand",
                                   observed_at__year=2026)
    # In force from when its last part's price was: the GPU's.
    assert quote.observed_at == dt.datetime(2026, 11, 3, 10, 0, 0, 123456, tzinfo=dt.timezone.utc)
    assert quote.zone == "" and "approximate" in quote.source and "12 vCPU + 85 GiB + 1 Tesla A100" in quote.source


def test_a_zone_the_price_book_lists_gets_the_regions_price_so_its_old_row_does_not_win(gcp):
    refresh("gcp")

    for zone in ("us-central1-a", "us-central1-b"):  # the shipped book's spot rows are per zone
        assert refreshed("g2-standard-4", zone=zone) == {"spot": refreshed("g2-standard-4")["spot"]}


def test_a_machine_missing_a_part_gets_no_quote_and_a_log_line(gcp, caplog):
    with caplog.at_level(logging.WARNING, logger="respawn_server.jobs.money.refreshers"):
        refresh("gcp")

    assert refreshed("a3-highgpu-8g") == {}
    assert refreshed("a2-highgpu-1g", region="europe-west4") == {}
    lines = [r.getMessage() for r in caplog.records]
    assert any("a3-highgpu-8g on_demand in us-central1" in line and "gpu H100 80GB" in line for line in lines)


def test_it_pages_with_the_token_and_sends_the_api_key(gcp):
    refresh("gcp")

    calls = gcp.requests_to("GET", "/v1/services/6F81-5844-456A/skus")
    assert len(calls) == len(gcp.skus) // 5 + 1
    assert [c.query.get("pageToken") for c in calls[:3]] == [None, "5", "10"]
    assert {c.headers.get("X-Goog-Api-Key") for c in calls} == {"key-1"}
    assert {c.query.get("currencyCode") for c in calls} == {"USD"}


def test_a_refused_api_key_is_a_clear_error(gcp, price_settings):
    price_settings(gcp_billing_url=gcp.endpoint, gcp_api_key="wrong")
    with pytest.raises(PriceRefreshError, match="403"):
        refresh("gcp")


def test_running_twice_adds_nothing_even_when_the_catalog_restamps_unchanged_prices(gcp):
    assert refresh("gcp").added == 20
    for entry in gcp.skus:
        entry["pricingInfo"][0]["effectiveTime"] = "2026-11-10T00:00:00Z"

    assert refresh("gcp").added == 0


def test_a_new_gpu_price_adds_quotes_for_the_machines_with_that_gpu_and_keeps_the_old(gcp):
    refresh("gcp")
    gcp.add_gpu("Tesla A100", "us-central1", on_demand=3.1, spot=1.02, effective="2026-11-20T00:00:00Z")
    assert [s["description"] for s in gcp.skus[5:7]] == [
        "Nvidia Tesla A100 GPU running in Americas", "Spot Preemptible Nvidia Tesla A100 GPU running in Americas"]
    del gcp.skus[5:7]  # the first A100 SKUs (after A2's five): the catalog shows only the current price

    result = refresh("gcp")

    assert result.added == 2  # a2-highgpu-1g and -8g on demand (region-wide only); spot is unchanged
    series = PriceQuote.objects.filter(provider="gcp", instance_type="a2-highgpu-1g", market="on_demand",
                                       observed_at__year=2026).order_by("observed_at")
    assert [q.usd_per_hour for q in series] == [
        a2_on_demand("0.031611", "0.004237", "2.933908").quantize(Decimal("0.00001")),
        a2_on_demand("0.031611", "0.004237", "3.1").quantize(Decimal("0.00001")),
    ]


def test_a_broken_sku_is_skipped_with_a_log_line(gcp, caplog):
    broken = sku("Nvidia L4 GPU running in Americas", "GPU", "OnDemand", ["us-central1"], "h", 0.5, LATER)
    broken["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"]["nanos"] = "lots"
    gcp.skus.insert(0, broken)

    with caplog.at_level(logging.WARNING, logger="respawn_server.jobs.money.refreshers"):
        refresh("gcp")

    [line] = [r.getMessage() for r in caplog.records if "Nvidia L4" in r.getMessage()]
    assert "'nanos' must be int" in line
    assert refreshed("g2-standard-4")["on_demand"] == Decimal("0.70682")


def test_the_ledger_prices_a_spot_vm_in_a_listed_zone_at_the_refreshed_price_from_its_time_on(gcp):
    refresh("gcp")
    index = price_index(["g2-standard-4"])

    def spot_at(when):
        second = int((when - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)).total_seconds())
        return index.price_at(second, "gcp", "us-central1", "us-central1-a", "g2-standard-4", "spot")

    assert spot_at(dt.datetime(2026, 10, 31, tzinfo=dt.timezone.utc)) == Decimal("0.23320")  # the shipped book's
    assert spot_at(dt.datetime(2026, 11, 2, tzinfo=dt.timezone.utc)) == refreshed("g2-standard-4")["spot"]


def price_index(types):
    rows = PriceQuote.objects.filter(provider="gcp", instance_type__in=types)
    return PriceIndex(Quote(provider=q.provider, region=q.region, zone=q.zone, instance_type=q.instance_type,
                            market=q.market, usd_per_hour=q.usd_per_hour, observed_at=q.observed_at)
                      for q in rows)
