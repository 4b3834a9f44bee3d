"""Preemption-notice watchers, one module per source (DESIGN §7)."""

from __future__ import annotations

from respawn.notices.aws import AwsWatcher
from respawn.notices.azure import AzureWatcher
from respawn.notices.base import PREEMPT, REBALANCE, NoticeEvent, PollingWatcher
from respawn.notices.gcp import GcpWatcher
from respawn.notices.local import LocalWatcher

WATCHERS: dict[str, type[PollingWatcher]] = {"aws": AwsWatcher, "gcp": GcpWatcher, "azure": AzureWatcher, "local": LocalWatcher}
DEFAULT_METADATA_URLS = {
    "aws": "http://169.254.169.254",
    "gcp": "http://metadata.google.internal",
    "azure": "http://169.254.169.254",
    "local": "",  # the local "VM" supervisor passes its endpoint
}
# How often each source is polled by default: AWS documents 5 s for
# instance-action; Azure recommends about once a second; GCP long-polls.
DEFAULT_POLL_S = {"aws": 5.0, "gcp": 1.0, "azure": 1.0, "local": 1.0}


def make_watcher(provider: str, metadata_url: str, poll_interval_s: float | None = None) -> PollingWatcher:
    if provider not in WATCHERS:
        raise ValueError(f"provider {provider!r} is not one of {', '.join(WATCHERS)}")
    return WATCHERS[provider](metadata_url, poll_interval_s=poll_interval_s or DEFAULT_POLL_S[provider])


__all__ = ["NoticeEvent", "PREEMPT", "REBALANCE", "WATCHERS", "DEFAULT_METADATA_URLS", "DEFAULT_POLL_S", "make_watcher"]
