"""Celery's `filesystem://` broker, with messages that appear whole.

kombu's filesystem transport creates a message file and then writes it; a
worker polling the folder can move and read the file in between and crash on
an empty payload. Writing under a name the reader ignores and renaming it into
place (atomic on one filesystem) closes that window."""

import os
import uuid
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + ".partial"  # the reader takes only names ending in "<queue>.msg"
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.rename(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel


def install() -> None:
    TRANSPORT_ALIASES["filesystem"] = f"{__name__}:Transport"
