"""Configured providers for this deployment, one per (cloud, region), built from
settings (RESPAWN_PROVIDER_CONFIG) and cached for the process."""

from __future__ import annotations

import functools

from django.conf import settings

from respawn_server.jobs.fleet.providers import get_provider
from respawn_server.jobs.fleet.providers.base import Provider

# Providers whose config names the region per instance (one client per region).
REGIONAL = ("aws",)


@functools.cache
def provider_for(name: str, region: str = "") -> Provider:
    if name not in settings.RESPAWN["PROVIDERS"]:
        raise ValueError(f"provider {name!r} is not enabled (RESPAWN_PROVIDERS={settings.RESPAWN['PROVIDERS']})")
    config = dict(settings.RESPAWN["PROVIDER_CONFIG"].get(name, {}))
    if name in REGIONAL:
        config.setdefault("region", region)
    if name == "gcp" and config.get("credentials") == "anonymous":  # an emulator takes no credentials
        from google.auth.credentials import AnonymousCredentials

        config["credentials"] = AnonymousCredentials()
    return get_provider(name, **config)
