"""The orphan sweep of reconcile on a regional cloud (AWS: one EC2 client per region)."""

from respawn_server.jobs.fleet.leftovers import reap_orphans
from respawn_server.jobs.fleet.registry import provider_for


def test_with_no_aws_instance_in_use_the_sweep_asks_no_region_less_client(settings, db):
    # AwsConfig refuses an empty region: asking for one failed every reconcile before it could schedule.
    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": ["aws"], "PROVIDER_CONFIG": {"aws": {}}}
    provider_for.cache_clear()
    try:
        assert reap_orphans() == 0
    finally:
        provider_for.cache_clear()
