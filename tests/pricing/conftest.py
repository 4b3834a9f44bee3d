"""Fixtures for the price refreshers: moto (shared with the provider tests, reset
between tests), the price emulators, and the settings that point the refreshers
at them."""

from __future__ import annotations

import pytest

from tests.providers.conftest import moto, moto_url  # noqa: F401  (fixtures)


@pytest.fixture
def aws_keys(monkeypatch):
    # boto3's own credential chain, as in production; moto accepts any keys.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def price_settings(settings):
    """Edit settings.RESPAWN["PRICE_REFRESH"] for one test, e.g. price_settings(azure_prices_url=...)."""
    original = settings.RESPAWN

    def point(**fields):
        settings.RESPAWN = {**original, "PRICE_REFRESH": {**original["PRICE_REFRESH"], **fields}}

    return point
