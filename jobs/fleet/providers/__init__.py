"""Providers by name. A cloud's module, and its SDK, is imported only when that
provider is asked for: google-cloud-compute alone takes seconds to import."""

from __future__ import annotations

from importlib import import_module

from respawn_server.jobs.fleet.providers.base import Provider

# name -> (module, provider class, config dataclass).
PROVIDERS: dict[str, tuple[str, str, str]] = {
    "aws": ("respawn_server.jobs.fleet.providers.aws", "AwsProvider", "AwsConfig"),
    "gcp": ("respawn_server.jobs.fleet.providers.gcp", "GcpProvider", "GcpConfig"),
    "azure": ("respawn_server.jobs.fleet.providers.azure", "AzureProvider", "AzureConfig"),
    "local": ("respawn_server.jobs.fleet.providers.local", "LocalProvider", "LocalConfig"),
}


def get_provider(name: str, **config) -> Provider:
    """The provider called `name`, configured by the fields of its config dataclass,
    e.g. get_provider("aws", region="us-east-1", endpoint_url="http://127.0.0.1:5000")."""
    try:
        module_name, provider_class, config_class = PROVIDERS[name]
    except KeyError:
        raise ValueError(f"unknown provider {name!r}; known providers: {', '.join(sorted(PROVIDERS))}") from None
    module = import_module(module_name)
    try:
        provider_config = getattr(module, config_class)(**config)
    except TypeError as exc:  # a missing or misspelt field
        raise ValueError(f"bad configuration for provider {name!r}: {exc}") from None
    return getattr(module, provider_class)(provider_config)
