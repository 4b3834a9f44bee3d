"""A PostgreSQL server of a test's own (tests/chaos stops one mid-run; the benches that
need PostgreSQL smoke-run on one), from the system's PostgreSQL binaries."""

import glob
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg

from tests.conftest import free_port


class PostgresCluster:
    """A throwaway cluster on a free port; initdb refuses root, so it runs as postgres."""

    def __init__(self):
        self.port = free_port()
        # Not under pytest's tmp dir: postgres must be able to reach it.
        self.home = Path(tempfile.mkdtemp(prefix="respawn-test-pg-"))
        self.home.chmod(0o755)
        self.data = self.home / "data"
        self.data.mkdir()
        shutil.chown(self.data, "postgres", "postgres")
        self.bin = Path(sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1])
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, *argv: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *argv], check=True, capture_output=True, timeout=120)

    def init(self):
        self._as_postgres(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                          "--no-sync")
        return self

    def start(self):
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options,
                          "-l", str(self.data / "server.log"), "-w", "start")
        return self

    def stop(self):
        """Immediate: the way a crashed or killed server goes (it recovers on start)."""
        self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def query(self, sql: str, *params):
        with psycopg.connect(self.url.replace("postgres://", "postgresql://"), autocommit=True) as conn:
            return conn.execute(sql, params).fetchall()

    def remove(self):
        subprocess.run(["runuser", "-u", "postgres", "--", str(self.bin / "pg_ctl"), "-D", str(self.data), "-m",
                        "immediate", "-w", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(self.home, ignore_errors=True)
