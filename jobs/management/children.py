"""Long-running child processes of one command (`manage.py demo`'s web, worker
and beat), each in a session of its own with its output in a log file.

A session of its own keeps the terminal's Ctrl-C away from the child: SIGINT goes
to the terminal's foreground process group, and the command alone decides how and
when each child stops. Signalled once (a second signal cut gunicorn's graceful stop
short and left a deadlocked worker on the port), waited for with a bound, and then
its whole process group killed, so no worker of it outlives the command.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

POLL_S = 0.05


class Child:
    def __init__(self, argv: list[str], *, env: dict[str, str], log_path: Path):
        self.log_path = log_path
        self.signalled = False
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def exited(self) -> bool:
        """Whether the child has exited. It is left unreaped, so its process group's id
        names no other group until `stop` has killed what is left in it."""
        try:
            return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True

    def terminate(self) -> None:
        """SIGTERM, once: a second signal cuts a child's orderly stop short."""
        if not self.signalled and not self.exited():
            os.kill(self.pid, signal.SIGTERM)  # not Popen.send_signal: it may reap the child first
        self.signalled = True

    def stop(self, *, timeout_s: float) -> None:
        """`terminate`, then SIGKILL to the child's process group: once the child has
        exited (to what it left behind) or after `timeout_s`."""
        if self.proc.returncode is not None:
            return
        self.terminate()
        give_up = time.monotonic() + timeout_s
        while not self.exited() and time.monotonic() < give_up:
            time.sleep(POLL_S)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
