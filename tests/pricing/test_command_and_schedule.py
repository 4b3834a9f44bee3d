"""How the refreshers are run: `manage.py refresh_prices`, and the beat entries that
exist only when RESPAWN_PRICE_REFRESH_S asks for them."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from respawn_server.jobs.money.refreshers import RefreshConfig
from tests.emulators.azure_prices import AzurePricesEmulator
from tests.test_settings import CLEAN_ENV, settings_value


@pytest.mark.django_db
def test_the_command_refreshes_the_named_cloud_and_says_what_it_added(price_settings, capsys):
    with AzurePricesEmulator() as azure:
        azure.add_vm_size("Standard_NC40ads_H100_v5", "eastus", linux=6.98, spot=2.443, effective="2026-11-01T00:00:00Z")
        price_settings(azure_prices_url=azure.url)

        call_command("refresh_prices", "azure")
        call_command("refresh_prices", "azure")

    assert capsys.readouterr().out.splitlines() == ["azure: 2 quotes read, 2 new", "azure: 2 quotes read, 0 new"]


@pytest.mark.django_db
def test_the_command_fails_naming_the_cloud_whose_source_is_broken(price_settings, capsys):
    with AzurePricesEmulator() as azure:
        price_settings(gcp_billing_url=azure.endpoint)  # answers 404 JSON for the catalog's path

        with pytest.raises(CommandError, match="price refresh failed for gcp"):
            call_command("refresh_prices", "gcp")

    assert "gcp: gcp billing catalog: GET" in capsys.readouterr().err


def test_the_command_refuses_a_cloud_without_a_refresher():
    with pytest.raises(CommandError, match="no price refresher for local; choose from aws, azure, gcp"):
        call_command("refresh_prices", "local")


def test_a_bad_endpoint_setting_is_refused_naming_it():
    with pytest.raises(ValueError, match="azure_prices_url must be an http"):
        RefreshConfig(azure_prices_url="prices.azure.com/api/retail/prices")


def test_no_beat_entry_unless_an_interval_is_set_and_the_endpoints_come_from_the_environment(tmp_path):
    env = {**CLEAN_ENV, "RESPAWN_VAR_DIR": str(tmp_path), "RESPAWN_PROVIDERS": "aws,local,gcp",
           "RESPAWN_AZURE_PRICES_URL": "http://127.0.0.1:9/prices", "RESPAWN_GCP_BILLING_URL": "http://127.0.0.1:9",
           "RESPAWN_PROVIDER_CONFIG": '{"aws": {"endpoint_url": "http://127.0.0.1:5000"}}'}
    beat, config = json.loads(settings_value(
        "__import__('json').dumps([sorted(settings.CELERY_BEAT_SCHEDULE), settings.RESPAWN['PRICE_REFRESH']])", env))
    assert beat == ["reconcile"]
    assert (config["azure_prices_url"], config["gcp_billing_url"], config["aws_endpoint_url"]) == (
        "http://127.0.0.1:9/prices", "http://127.0.0.1:9", "http://127.0.0.1:5000")

    env["RESPAWN_PRICE_REFRESH_S"] = "3600"
    expr = ("__import__('json').dumps({k: [v['task'], list(v['args']), v['options']] "
            "for k, v in settings.CELERY_BEAT_SCHEDULE.items() if k != 'reconcile'})")
    assert json.loads(settings_value(expr, env)) == {
        "refresh-prices-aws": ["respawn_server.jobs.tasks.refresh_prices", ["aws"], {"expires": 3600.0}],
        "refresh-prices-gcp": ["respawn_server.jobs.tasks.refresh_prices", ["gcp"], {"expires": 3600.0}],
    }
