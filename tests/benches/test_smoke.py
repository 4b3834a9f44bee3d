"""Every bench under bench/ runs to its end in its smoke form (`--smoke`: tiny sizes,
no --check), so none breaks unseen (bench/dashboard.py once did, with a migration).
A smoke run's figures mean nothing; that the bench still runs does."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.postgres_cluster import PostgresCluster

BENCHES = sorted(path.name for path in (ROOT / "bench").glob("*.py"))
# PostgreSQL only (they make a fresh database with DROP/CREATE DATABASE, dashboard.py loads
# it with COPY): they run on a cluster of the test's own, whatever the suite's database is.
ON_POSTGRES = {"dashboard.py", "heartbeats.py", "notify.py"}
REDIS_URL = os.environ.get("RESPAWN_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
# Each bench picks its own database and broker; a nested pytest (bench/conformance.py) its own worker setup.
ENV = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")
       and not k.startswith(("PYTEST_", "BENCH_"))}


@pytest.fixture(scope="module")
def postgres():
    cluster = PostgresCluster().init().start()
    yield cluster
    cluster.remove()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("bench", BENCHES)
def test_the_bench_runs_to_its_end_in_its_smoke_form(bench, request, tmp_path):
    argv = [sys.executable, f"bench/{bench}", "--smoke"]
    if bench == "simulate.py":  # its plot, by default in the repository's var/
        argv += ["--png", str(tmp_path / "simulate.png")]
    if bench in ON_POSTGRES:
        port = request.getfixturevalue("postgres").port
        argv += ["--database-url", f"postgres://postgres@127.0.0.1:{port}/respawn_bench_{Path(bench).stem}"]
    if bench == "notify.py":
        argv += ["--broker-url", REDIS_URL]
    done = subprocess.run(argv, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, f"{' '.join(argv[1:])} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def test_the_gpu_check_script_parses():
    """bench/gpu_check.sh needs a CUDA machine to run; its parts run above and in tests/gpu."""
    done = subprocess.run(["bash", "-n", "bench/gpu_check.sh"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
