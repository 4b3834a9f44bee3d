"""Where the refreshers fetch prices from and how much they may fetch per run."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True, kw_only=True, slots=True)
class RefreshConfig:
    azure_prices_url: str = "https://prices.azure.com/api/retail/prices"
    """The Azure Retail Prices API (no credentials needed)."""
    gcp_billing_url: str = "https://cloudbilling.googleapis.com"
    """The Cloud Billing Catalog API's root; /v1/services/... is appended."""
    gcp_api_key: str | None = None
    """An API key for the Catalog API (sent as X-Goog-Api-Key); Google refuses anonymous calls."""
    aws_endpoint_url: str | None = None
    """EC2 endpoint override (e.g. moto); None: the region's real endpoint. Credentials: boto3's own chain."""
    aws_lookback_h: float = 24.0
    """AWS: spot price history from this many hours ago (the price in force then, and every change since)."""
    aws_page_size: int = 1000
    max_pages: int = 200
    """Per provider and region: more pages than this ends the run with an error, never a silent cut."""
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("azure_prices_url", "gcp_billing_url") + (("aws_endpoint_url",) if self.aws_endpoint_url else ()):
            url = urlsplit(getattr(self, name))
            if url.scheme not in ("http", "https") or not url.hostname:
                raise ValueError(f"price refresh {name} must be an http(s) URL, got {getattr(self, name)!r}")
        if self.aws_lookback_h <= 0:
            raise ValueError(f"price refresh aws_lookback_h must be positive, got {self.aws_lookback_h}")
        if not 5 <= self.aws_page_size <= 1000:
            raise ValueError(f"price refresh aws_page_size must be within 5..1000 (EC2's limits), got {self.aws_page_size}")
        if self.max_pages < 1:
            raise ValueError(f"price refresh max_pages must be at least 1, got {self.max_pages}")
        if self.timeout_s <= 0:
            raise ValueError(f"price refresh timeout_s must be positive, got {self.timeout_s}")

    @classmethod
    def from_settings(cls) -> RefreshConfig:
        from django.conf import settings

        return cls(**settings.RESPAWN["PRICE_REFRESH"])
