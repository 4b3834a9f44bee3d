"""Money's tables: every price quote ever seen, of VM types and of managed disks
(respawn_server.jobs.money.prices holds their plain form)."""

from django.db import models

from respawn_server.jobs.core.choices import MARKET_CHOICES


class PriceQuote(models.Model):
    provider = models.CharField(max_length=20)
    region = models.CharField(max_length=50)
    zone = models.CharField(max_length=50, blank=True, help_text="Empty: every zone of the region.")
    instance_type = models.CharField(max_length=50)
    market = models.CharField(max_length=10, choices=MARKET_CHOICES)
    usd_per_hour = models.DecimalField(max_digits=10, decimal_places=5)
    observed_at = models.DateTimeField()
    source = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["provider", "region", "zone", "instance_type", "market", "observed_at"]
        indexes = [
            models.Index(fields=["provider", "instance_type", "market", "observed_at"], name="price_lookup_idx"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["provider", "region", "zone", "instance_type", "market", "observed_at"],
                name="price_quote_unique",
            )
        ]


class DiskPriceQuote(models.Model):
    """A managed disk's list price per month in one region, kept like PriceQuote: every
    quote ever seen, so the price in force at each moment prices a stopped disk."""

    provider = models.CharField(max_length=20)
    region = models.CharField(max_length=50)
    sku = models.CharField(max_length=50, help_text="The cloud's price name, e.g. Azure's 'P10 LRS'.")
    usd_per_month = models.DecimalField(max_digits=12, decimal_places=5)
    observed_at = models.DateTimeField()
    source = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["provider", "region", "sku", "observed_at"]
        constraints = [
            models.UniqueConstraint(fields=["provider", "region", "sku", "observed_at"], name="disk_price_quote_unique"),
        ]
