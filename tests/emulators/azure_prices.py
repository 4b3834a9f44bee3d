"""The Azure Retail Prices API (https://prices.azure.com/api/retail/prices) on 127.0.0.1.

Serves the real JSON shape: `Items`, `NextPageLink` (absolute, with the port, as
Azure writes it), `Count`, `BillingCurrency`... Each VM size comes with the meters
Azure lists for it: Linux and Windows, pay-as-you-go, Spot and Low Priority,
reservations and Dev/Test; each managed disk tier with the meters Azure lists under
serviceName "Storage" (the disk itself, its mount meter, the zone-redundant twin).
The `$filter` is applied for the clauses the refresher sends (`serviceName`,
`priceType`, `armRegionName`, `armSkuName`, `skuName` with `eq`/`or`),
so a wrong filter shows up as wrong rows. Pages of `page_size` items, skipped by
`$skip` as Azure does.

    with AzurePricesEmulator(page_size=5) as azure:
        azure.add_vm_size("Standard_NC24ads_A100_v4", "eastus", linux=3.673, spot=1.2855)
        requests.get(azure.url, params={"$filter": "..."})
"""

from __future__ import annotations

import re
import uuid
from urllib.parse import quote

from tests.emulators.json_http import JsonHttpEmulator

SERIES = re.compile(r"^Standard_(?P<name>.+)$")
CLAUSE = re.compile(r"(\w+) eq '([^']*)'")


class AzurePricesEmulator(JsonHttpEmulator):
    PATH = "/api/retail/prices"

    def __init__(self, *, page_size: int = 100):
        super().__init__()
        self.page_size = page_size
        self.items: list[dict] = []
        self.route("GET", self.PATH, self._prices)

    @property
    def url(self) -> str:
        return self.endpoint + self.PATH

    def add_item(self, **fields) -> dict:
        self.items.append(fields)
        return fields

    def add_vm_size(self, arm_sku: str, region: str, *, linux: float, spot: float,
                    effective: str = "2024-06-01T00:00:00Z") -> None:
        """The meters Azure lists for one VM size in one region: the two we price
        (Linux pay-as-you-go and Linux Spot) and five we must not."""
        short = SERIES.match(arm_sku)["name"].replace("_", " ")
        product = f"Virtual Machines {short.split(' ')[0]} Series"
        for meter, product_name, price, kind in (
            (short, product, linux, "Consumption"),
            (f"{short} Spot", product, spot, "Consumption"),
            (f"{short} Low Priority", product, round(spot * 0.9, 4), "Consumption"),
            (short, f"{product} Windows", round(linux * 1.2, 4), "Consumption"),
            (f"{short} Spot", f"{product} Windows", round(spot * 1.3, 4), "Consumption"),
            (short, product, round(linux * 0.6, 4), "DevTestConsumption"),
            (short, product, round(linux * 0.6 * 8760, 2), "Reservation"),
        ):
            self.add_item(**meter_row(arm_sku, region, meter, product_name, price, kind, effective))

    def add_disk_tier(self, tier: str, region: str, *, per_month: float, effective: str = "2024-06-01T00:00:00Z",
                      product: str = "Premium SSD Managed Disks") -> None:
        """The meters Azure lists for one managed disk tier in one region: the disk's
        monthly price (the one we keep) and two we must not."""
        for sku, meter, price in ((f"{tier} LRS", f"{tier} LRS Disk", per_month),
                                  (f"{tier} LRS", f"{tier} LRS Disk Mount", round(per_month * 0.06, 4)),
                                  (f"{tier} ZRS", f"{tier} ZRS Disk", round(per_month * 1.5, 2))):
            self.add_item(**disk_row(sku, region, meter, product, price, effective))

    def _prices(self, match, query, body):
        selected = [item for item in self.items if matches(item, query.get("$filter", ""))]
        skip = int(query.get("$skip", 0))
        page = selected[skip: skip + self.page_size]
        answer = {"BillingCurrency": "USD", "CustomerEntityId": "Default", "CustomerEntityType": "Retail",
                  "Items": page, "Count": len(page), "NextPageLink": None}
        if skip + self.page_size < len(selected):
            # Azure's own form: the whole query again plus $skip, on an absolute URL that names the port.
            host, port = self._server.server_address
            answer["NextPageLink"] = (f"http://{host}:{port}{self.PATH}?$filter={quote(query.get('$filter', ''))}"
                                      f"&$skip={skip + self.page_size}")
        return 200, answer, {}


def meter_row(arm_sku: str, region: str, meter: str, product: str, price: float, kind: str, effective: str) -> dict:
    row = {
        "currencyCode": "USD", "tierMinimumUnits": 0.0, "retailPrice": price, "unitPrice": price,
        "armRegionName": region, "location": region.upper(), "effectiveStartDate": effective,
        "meterId": str(uuid.uuid4()), "meterName": meter, "productId": "DZH318Z0BQ4W",
        "skuId": "DZH318Z0BQ4W/00" + meter[:2].upper(), "productName": product, "skuName": meter,
        "serviceName": "Virtual Machines", "serviceId": "DZH313Z7MMC8", "serviceFamily": "Compute",
        "unitOfMeasure": "1 Hour", "type": kind, "isPrimaryMeterRegion": True, "armSkuName": arm_sku,
    }
    if kind == "Reservation":
        row.update(unitOfMeasure="1 Hour", reservationTerm="1 Year")
    return row


def disk_row(sku: str, region: str, meter: str, product: str, price: float, effective: str) -> dict:
    """As Azure lists a managed disk meter: no armSkuName, the tier in skuName, priced per month."""
    return {
        "currencyCode": "USD", "tierMinimumUnits": 0.0, "retailPrice": price, "unitPrice": price,
        "armRegionName": region, "location": region.upper(), "effectiveStartDate": effective,
        "meterId": str(uuid.uuid4()), "meterName": meter, "productId": "DZH318Z0BP04",
        "skuId": "DZH318Z0BP04/00" + sku[:2].upper(), "productName": product, "skuName": sku,
        "serviceName": "Storage", "serviceId": "DZH317F1HKN0", "serviceFamily": "Storage",
        "unitOfMeasure": "1/Month", "type": "Consumption", "isPrimaryMeterRegion": True, "armSkuName": "",
    }


def matches(item: dict, odata_filter: str) -> bool:
    """Each `and` group must hold; within a group, any `eq` clause of its `or`s."""
    for group in re.split(r"\band\b(?![^()]*\))", odata_filter):
        clauses = CLAUSE.findall(group)
        if not clauses:
            continue
        if not any(_value(item, name) == value for name, value in clauses):
            return False
    return True


def _value(item: dict, name: str):
    # `priceType` in the filter is the field `type` in the items.
    return item.get("type" if name == "priceType" else name)
