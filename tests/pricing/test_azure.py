"""Azure Retail Prices: the real JSON shape over several pages, Linux pay-as-you-go
and Spot told apart from Windows, Low Priority, reservations and Dev/Test."""

from __future__ import annotations

import datetime as dt
import logging
from decimal import Decimal

import pytest

from respawn_server.jobs.models import DiskPriceQuote, PriceQuote
from respawn_server.jobs.money.refreshers import PriceRefreshError, refresh
from respawn_server.jobs.money.refreshers.azure import disk_filter, price_filter
from respawn_server.jobs.tasks import refresh_prices
from tests.emulators.azure_prices import AzurePricesEmulator, disk_row, meter_row

pytestmark = pytest.mark.django_db

JUNE = dt.datetime(2024, 6, 1, tzinfo=dt.timezone.utc)
NOVEMBER = "2026-11-01T00:00:00Z"


@pytest.fixture
def azure(price_settings):
    with AzurePricesEmulator(page_size=4) as emulator:
        emulator.add_vm_size("Standard_NC24ads_A100_v4", "eastus", linux=3.673, spot=1.2855, effective=NOVEMBER)
        emulator.add_vm_size("Standard_ND96isr_H100_v5", "westeurope", linux=108.152, spot=37.8532,
                             effective=NOVEMBER)
        emulator.add_vm_size("Standard_D2s_v5", "eastus", linux=0.096, spot=0.0192, effective=NOVEMBER)  # not in the book
        price_settings(azure_prices_url=emulator.url)
        yield emulator


def refreshed(instance_type, region):
    return dict(PriceQuote.objects.filter(provider="azure", instance_type=instance_type, region=region,
                                          observed_at__year=2026).values_list("market", "usd_per_hour"))


def test_only_linux_pay_as_you_go_and_linux_spot_become_quotes(azure):
    result = refresh("azure")

    assert (result.seen, result.added) == (4, 4)  # a Windows or Low Priority meter would be a fifth
    assert refreshed("Standard_NC24ads_A100_v4", "eastus") == {"on_demand": Decimal("3.67300"),
                                                               "spot": Decimal("1.28550")}
    assert refreshed("Standard_ND96isr_H100_v5", "westeurope") == {"on_demand": Decimal("108.15200"),
                                                                   "spot": Decimal("37.85320")}
    quote = PriceQuote.objects.get(provider="azure", instance_type="Standard_NC24ads_A100_v4", market="spot",
                                   observed_at__year=2026)
    assert quote.zone == "" and quote.observed_at == dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
    assert "NC24ads A100 v4 Spot" in quote.source
    assert not PriceQuote.objects.filter(instance_type="Standard_D2s_v5").exists()


def test_it_follows_next_page_link_with_the_filter_on_every_page(azure):
    refresh("azure")

    calls = [c for c in azure.requests_to("GET", "/api/retail/prices") if "Virtual Machines" in c.query["$filter"]]
    assert len(calls) == 3  # two sizes of the book × five Consumption meters, 4 a page
    assert [c.query.get("$skip") for c in calls] == [None, "4", "8"]
    sent = {c.query["$filter"] for c in calls}
    assert len(sent) == 1
    odata = sent.pop()
    assert odata.startswith("serviceName eq 'Virtual Machines' and priceType eq 'Consumption'")
    assert "armSkuName eq 'Standard_ND96asr_v4'" in odata and "armRegionName eq 'westeurope'" in odata


def test_the_filter_names_every_type_and_region_of_the_price_book():
    odata = price_filter({"eastus": {"Standard_A"}, "westeurope": {"Standard_B", "Standard_A"}})
    assert odata == ("serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and "
                     "(armRegionName eq 'eastus' or armRegionName eq 'westeurope') and "
                     "(armSkuName eq 'Standard_A' or armSkuName eq 'Standard_B')")


def test_running_twice_adds_nothing_and_a_new_price_is_kept_beside_the_old(azure):
    assert refresh_prices("azure") == 4
    assert refresh_prices("azure") == 0
    azure.add_item(**meter_row("Standard_NC24ads_A100_v4", "eastus", "NC24ads A100 v4 Spot",
                               "Virtual Machines NCadsA100v4 Series", 1.3502, "Consumption", "2026-11-20T00:00:00Z"))

    assert refresh("azure").added == 1

    series = PriceQuote.objects.filter(provider="azure", instance_type="Standard_NC24ads_A100_v4", region="eastus",
                                       market="spot").order_by("observed_at")
    assert [(q.observed_at.date(), q.usd_per_hour) for q in series] == [
        (JUNE.date(), Decimal("1.28550")),  # the shipped book's
        (dt.date(2026, 11, 1), Decimal("1.28550")),
        (dt.date(2026, 11, 20), Decimal("1.35020")),
    ]


def test_a_broken_item_is_skipped_with_a_log_line_and_the_others_are_kept(azure, caplog):
    broken = meter_row("Standard_NC24ads_A100_v4", "eastus", "NC24ads A100 v4", "Virtual Machines NCadsA100v4 Series",
                       3.9, "Consumption", "2026-11-15T00:00:00Z")
    broken["retailPrice"] = "three dollars"
    azure.items.insert(0, broken)

    with caplog.at_level(logging.WARNING, logger="respawn_server.jobs.money.refreshers"):
        assert refresh("azure").added == 4

    [line] = [r.getMessage() for r in caplog.records if "skipped row" in r.getMessage()]
    assert "three dollars" in line and "retailPrice" in line


def test_a_next_page_link_to_another_host_stops_the_refresh(azure, monkeypatch):
    original = azure._prices

    def leading_away(match, query, body):
        status, answer, headers = original(match, query, body)
        answer["NextPageLink"] = "https://example.invalid/api/retail/prices?$skip=6"
        return status, answer, headers

    monkeypatch.setattr(azure, "routes", [("GET", azure.routes[0][1], leading_away)])

    with pytest.raises(PriceRefreshError, match="does not lead back"):
        refresh("azure")
    assert len(azure.requests_to("GET", "/api/retail/prices")) == 1


def test_more_pages_than_allowed_stops_with_an_error_keeping_the_pages_read(azure, price_settings):
    price_settings(azure_prices_url=azure.url, max_pages=2)

    with pytest.raises(PriceRefreshError, match="more than 2 pages; raise RESPAWN_PRICE_MAX_PAGES"):
        refresh("azure")

    assert len(azure.requests_to("GET", "/api/retail/prices")) == 2
    assert PriceQuote.objects.filter(provider="azure", observed_at__year=2026).exists()


# ---- managed disks: what an evicted, deallocated VM keeps billing ----

def refreshed_disks():
    return {(q.region, q.sku): q.usd_per_month for q in DiskPriceQuote.objects.filter(observed_at__year=2026)}


def test_the_disk_meter_of_each_wanted_tier_becomes_a_monthly_quote(azure):
    azure.add_disk_tier("P10", "eastus", per_month=19.71, effective=NOVEMBER)
    azure.add_disk_tier("P10", "westeurope", per_month=21.68, effective=NOVEMBER)
    azure.add_disk_tier("P20", "eastus", per_month=73.22, effective=NOVEMBER)  # no VM of ours has one

    result = refresh("azure")

    assert result.added == 4 + 2  # the VM meters, then one disk meter per region; no mount, ZRS or P20
    assert refreshed_disks() == {("eastus", "P10 LRS"): Decimal("19.71000"),
                                 ("westeurope", "P10 LRS"): Decimal("21.68000")}
    quote = DiskPriceQuote.objects.get(region="eastus", observed_at__year=2026)
    assert quote.observed_at == dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
    assert "'P10 LRS Disk'" in quote.source and "Premium SSD Managed Disks" in quote.source
    [disks] = {c.query["$filter"] for c in azure.requests_to("GET", "/api/retail/prices")
               if "Storage" in c.query["$filter"]}
    assert disks == disk_filter({"eastus", "westeurope"}, {"P10 LRS"})
    assert refresh("azure").added == 0, "every quote is kept once"


def test_it_asks_for_the_configured_os_disk_tier_too(azure, settings):
    settings.RESPAWN = {**settings.RESPAWN, "PROVIDER_CONFIG": {"azure": {"os_disk_tier": "E10"}}}
    azure.add_disk_tier("E10", "eastus", per_month=9.6, effective=NOVEMBER, product="Standard SSD Managed Disks")

    refresh("azure")

    assert refreshed_disks() == {("eastus", "E10 LRS"): Decimal("9.60000")}


def test_a_disk_row_not_priced_per_month_is_skipped_with_a_log_line(azure, caplog):
    hourly = disk_row("P10 LRS", "eastus", "P10 LRS Disk", "Premium SSD Managed Disks", 0.027, NOVEMBER)
    hourly["unitOfMeasure"] = "1 Hour"
    azure.items.append(hourly)

    with caplog.at_level(logging.WARNING, logger="respawn_server.jobs.money.refreshers"):
        refresh("azure")

    assert refreshed_disks() == {}
    [line] = [r.getMessage() for r in caplog.records if "skipped row" in r.getMessage()]
    assert "'1 Hour' is not '1/Month'" in line


def test_the_disk_filter_names_every_region_and_tier():
    assert disk_filter({"westeurope", "eastus"}, {"P10 LRS", "E10 LRS"}) == (
        "serviceName eq 'Storage' and priceType eq 'Consumption' and "
        "(armRegionName eq 'eastus' or armRegionName eq 'westeurope') and "
        "(skuName eq 'E10 LRS' or skuName eq 'P10 LRS')")
