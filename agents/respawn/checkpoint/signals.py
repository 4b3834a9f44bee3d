"""The agent's two signals, as a training process receives them (docs/signals.md).

SIGTERM (checkpoint and stop) and SIGUSR1 (checkpoint now) only set a flag; the save
happens at the next step boundary. A process that handles them says so to the agent:
it puts a file named by its pid in RESPAWN_SIGNAL_TARGETS_DIR, and the agent signals
the processes listed there, and no other. Sent to the trainer's process group instead,
SIGTERM would reach its DataLoader workers (torch's worker loop dies of it) and every
other helper before the save could run; sent to `torchrun`, it would make torchrun
kill each rank's process group itself.

Under torchrun (TORCHELASTIC_RUN_ID set) a rank also asks the kernel for SIGKILL when
torchrun dies: torchrun starts each rank in a session of its own, so a rank would
outlive a VM's agent killed without a chance to clean up.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from respawn import protocol

PR_SET_PDEATHSIG = 1
Handler = Callable[[int, object], None]

_lock = threading.Lock()
_registrations = 0  # handlers installed in this process and not yet restored


def start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc/<pid>/stat field 22):
    with the pid, it names one process, whatever pid reuse happens later."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def install(on_stop: Handler, on_checkpoint_now: Handler) -> Callable[[], None]:
    """Handle SIGTERM and SIGUSR1 with the two callbacks and tell the agent this process
    takes its signals; returns what undoes both. Only the main thread can set handlers:
    elsewhere nothing is installed and nothing registered."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.signal(sig, handler) for sig, handler in ((signal.SIGTERM, on_stop), (signal.SIGUSR1, on_checkpoint_now))}
    _register()

    def restore() -> None:
        if not previous:
            return
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        previous.clear()
        _unregister()

    return restore


def _target_file() -> Path | None:
    directory = os.environ.get(protocol.ENV_SIGNAL_TARGETS_DIR)
    return Path(directory) / str(os.getpid()) if directory else None


def _register() -> None:
    global _registrations
    with _lock:
        _registrations += 1
        path = _target_file()
        if _registrations > 1 or path is None:
            return
        if os.environ.get("TORCHELASTIC_RUN_ID"):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "start_ticks": start_ticks(os.getpid())}))
        os.replace(tmp, path)


def _unregister() -> None:
    global _registrations
    with _lock:
        _registrations = max(0, _registrations - 1)
        path = _target_file()
        if _registrations == 0 and path is not None:
            path.unlink(missing_ok=True)
