"""Loaded with `-p` (pyproject's addopts), before pytest-django imports the settings:
the test process gets a var dir of its own, so a test run never writes into the
repository's `var/` (where `make demo`'s database and broker queue live: a test's
stale `schedule` message there would run in the next demo)."""

import atexit
import os
import shutil
import tempfile

_var_dir = tempfile.mkdtemp(prefix="respawn-test-var-")
os.environ["RESPAWN_VAR_DIR"] = _var_dir
os.environ.pop("RESPAWN_BROKER_DIR", None)
atexit.register(shutil.rmtree, _var_dir, ignore_errors=True)
