"""The local provider's notices: its "VM" supervisor serves an IMDS-compatible
endpoint (respawn.metadata_server, AWS flavour), so the AWS watcher reads it;
only the source recorded with the notice differs."""

from __future__ import annotations

from respawn.notices.aws import AwsWatcher
from respawn.protocol import NoticeSource


class LocalWatcher(AwsWatcher):
    source = NoticeSource.LOCAL
    window_s = None  # the spot simulator's lead is its own configuration's
