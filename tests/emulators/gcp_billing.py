"""The Cloud Billing Catalog API's Compute Engine SKUs on 127.0.0.1.

`GET /v1/services/6F81-5844-456A/skus?pageToken=...&pageSize=...` answers
`{"skus": [...], "nextPageToken": "..."}` (an empty token on the last page), each
SKU in the real shape: name, skuId, description, category {serviceDisplayName,
resourceFamily, resourceGroup, usageType}, serviceRegions, pricingInfo
[{effectiveTime, pricingExpression {usageUnit, tieredRates [{startUsageAmount,
unitPrice {currencyCode, units, nanos}}]}}], serviceProviderName.

    with GcpBillingEmulator(page_size=4) as gcp:
        gcp.add_family_parts("A2", "us-central1", core=0.031611, ram=0.004237)
        gcp.add_gpu("Tesla A100", "us-central1", on_demand=2.933908, spot=0.979)
"""

from __future__ import annotations

import uuid
from decimal import Decimal

from tests.emulators.json_http import JsonHttpEmulator

SERVICE = "6F81-5844-456A"
REGION_NAMES = {"us": "Americas", "europe": "EMEA", "asia": "APAC"}


class GcpBillingEmulator(JsonHttpEmulator):
    def __init__(self, *, page_size: int = 5000, api_key: str | None = None):
        super().__init__()
        self.page_size = page_size
        self.api_key = api_key
        self.skus: list[dict] = []
        self.route("GET", rf"/v1/services/{SERVICE}/skus", self._skus)

    def add_sku(self, sku: dict) -> dict:
        self.skus.append(sku)
        return sku

    def add_family_parts(self, family: str, region: str, *, core: float, ram: float, spot_factor: float = 0.3,
                         effective: str = "2024-06-01T07:14:09.143211Z") -> None:
        """vCPU and RAM SKUs of a machine family, on demand and Spot, plus its
        1-year commitment SKU (which the refresher must ignore)."""
        for usage, prefix, factor in (("OnDemand", "", 1), ("Preemptible", "Spot Preemptible ", spot_factor)):
            self.add_sku(sku(f"{prefix}{family} Instance Core running in {_place(region)}", "CPU", usage,
                             [region], "h", core * factor, effective))
            self.add_sku(sku(f"{prefix}{family} Instance Ram running in {_place(region)}", "RAM", usage,
                             [region], "GiBy.h", ram * factor, effective))
        self.add_sku(sku(f"Commitment v1: {family} Cpu in {_place(region)} for 1 Year", "CPU", "Commit1Yr",
                         [region], "h", core * 0.63, effective))

    def add_gpu(self, gpu: str, region: str, *, on_demand: float, spot: float,
                effective: str = "2024-06-01T07:14:09.143211Z") -> None:
        self.add_sku(sku(f"Nvidia {gpu} GPU running in {_place(region)}", "GPU", "OnDemand", [region], "h",
                         on_demand, effective))
        self.add_sku(sku(f"Spot Preemptible Nvidia {gpu} GPU running in {_place(region)}", "GPU", "Preemptible",
                         [region], "h", spot, effective))

    def _skus(self, match, query, body):
        if self.api_key is not None:
            sent = self.received[-1].headers.get("X-Goog-Api-Key")
            if sent != self.api_key:
                return 403, {"error": {"code": 403, "message": "The request is missing a valid API key.",
                                       "status": "PERMISSION_DENIED"}}, {}
        size = min(int(query.get("pageSize", 5000)), self.page_size)
        start = int(query.get("pageToken") or 0)
        page = self.skus[start: start + size]
        following = start + size
        # Google's tokens are opaque; an offset in disguise is enough for paging.
        return 200, {"skus": page, "nextPageToken": str(following) if following < len(self.skus) else ""}, {}


def sku(description: str, group: str, usage: str, regions: list[str], unit: str, usd: float,
        effective: str) -> dict:
    sku_id = uuid.uuid4().hex[:12].upper()
    return {
        "name": f"services/{SERVICE}/skus/{sku_id}",
        "skuId": sku_id,
        "description": description,
        "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": "Compute",
                     "resourceGroup": group, "usageType": usage},
        "serviceRegions": regions,
        "pricingInfo": [{
            "summary": "",
            "pricingExpression": {
                "usageUnit": unit,
                "displayQuantity": 1,
                "tieredRates": [{"startUsageAmount": 0, "unitPrice": money(usd)}],
                "usageUnitDescription": "hour" if unit == "h" else "gibibyte hour",
                "baseUnit": "s" if unit == "h" else "By.s",
                "baseUnitDescription": "second" if unit == "h" else "byte second",
                "baseUnitConversionFactor": 3600 if unit == "h" else 3865470566400,
            },
            "currencyConversionRate": 1,
            "effectiveTime": effective,
        }],
        "serviceProviderName": "Google",
        "geoTaxonomy": {"type": "REGIONAL", "regions": regions},
    }


def money(usd: float) -> dict:
    """Google's Money: whole units as a string, the rest in nanos."""
    amount = Decimal(str(usd)).quantize(Decimal("1e-9"))
    units = int(amount)
    return {"currencyCode": "USD", "units": str(units), "nanos": int((amount - units) * 10**9)}


def _place(region: str) -> str:
    return REGION_NAMES.get(region.split("-")[0], "Americas")
