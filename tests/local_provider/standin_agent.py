"""A stand-in for `respawn-agent run ...` in the local VM's process tests (the live
tests run the real agent): it accepts the agent's flags and sleeps, and with
`--escape` first starts a grandchild that leaves its session and its parent, the
way a careless trainer's helper process might; with `--ignore-sigterm` it does
not stop for a shutdown, so only the hard kill at the deadline ends it."""

from __future__ import annotations

import os
import signal
import sys
import time


def main() -> None:
    if "--ignore-sigterm" in sys.argv:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if "--escape" in sys.argv:
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(600)
            os._exit(0)
        os.wait()
    time.sleep(600)


if __name__ == "__main__":
    main()
