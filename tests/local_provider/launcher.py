"""`python -m tests.local_provider.launcher ROOT INSTANCE_ID CONFIG_JSON [URL TOKEN]`:
launch one local VM the way a Celery worker would, print its id, then wait to be
killed (the tests kill it to show the VM does not depend on its launcher)."""

from __future__ import annotations

import json
import sys
import time

from respawn_server.jobs.fleet.providers.local import LocalConfig, LocalProvider
from tests.local_provider.helpers import launch_request


def main() -> None:
    root, instance_id, config = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    extra = dict(control_plane_url=sys.argv[4], bootstrap_token=sys.argv[5]) if len(sys.argv) > 5 else {}
    provider = LocalProvider(LocalConfig(root=root, **config))
    print(provider.launch(launch_request(instance_id, **extra)), flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main()
