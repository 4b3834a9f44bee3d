from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _seed_prices(sender, **kwargs):
    from jobs.prices import seed_price_book

    seed_price_book()


class JobsConfig(AppConfig):
    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Money and placement work with no cloud account: the shipped price book
        # is in the database from the first migrate on.
        post_migrate.connect(_seed_prices, sender=self)
        from jobs.api import schema  # noqa: F401  (registers the OpenAPI auth schemes)
        from jobs import metrics  # noqa: F401  (workers count task failures for /metrics)
