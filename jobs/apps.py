from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _seed_prices(sender, **kwargs):
    from respawn_server.jobs.money.seed_prices import seed_price_book

    seed_price_book()


class JobsConfig(AppConfig):
    name = "respawn_server.jobs"
    # The label the tables, migrations and model references ('jobs.Job') were made under.
    label = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Money and placement work with no cloud account: the shipped price book
        # is in the database from the first migrate on.
        post_migrate.connect(_seed_prices, sender=self)
        # Imported for what importing them registers: the OpenAPI auth schemes, and the
        # signal by which workers count task failures for /metrics.
        from respawn_server.jobs.api import metrics, schema  # noqa: F401
        # Notifications are recorded in the transaction of what they tell of (DESIGN §11).
        from respawn_server.jobs.notify import events

        events.connect()
