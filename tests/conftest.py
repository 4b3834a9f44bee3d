"""Shared fixtures: people and teams, agents with tokens, and real processes
(web, Celery worker) running against the same test database as the test."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from cryptography.fernet import Fernet

from tests.agent_wheel import agent_wheel  # noqa: F401  (a fixture: the control plane holds the agent wheel)
from tests.factories import make_instance, make_job, make_team_with_members  # noqa: F401  (fixtures use them)

ROOT = Path(__file__).resolve().parent.parent


def pytest_sessionstart(session):
    # Tests of the database and broker use them for real: in CI a missing server
    # is a failure, never a skip.
    if os.environ.get("CI"):
        for var, scheme in (("DATABASE_URL", "postgres"), ("CELERY_BROKER_URL", "redis")):
            value = os.environ.get(var, "")
            if value and not value.startswith(scheme):
                pytest.exit(f"CI: {var}={value!r} is not a {scheme} URL", returncode=3)


# Fixtures through which a test reaches the database (and so the broker: a Celery task
# is sent on a transaction's commit, a worker shares the test's database).
STORE_FIXTURES = frozenset({"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback",
                            "live_server", "client", "admin_client", "django_user_model"})


def pytest_collection_modifyitems(config, items):
    """RESPAWN_TEST_SCOPE=store keeps the tests that use the database or the broker: the
    suite's second CI run (.ci/run), on the embedded default, where only those differ
    from the first run's PostgreSQL and Redis. A test that reads their configuration
    without a database fixture says so with the `store` marker. What a store changes in a
    whole-system run is how concurrent writers meet (row locks, SQLite's one writer): the
    demo market's run of preemptions (liveness), the elastic gang's three nodes and the
    chaos runs show it on both stores. The other whole-system runs (the trainer's process
    tree, a live agent's answers, reports and outages, the fixed three preemptions, the
    two-node gang, spares, drills, job steps, the loss curve, the browser, the CLI, the
    VM's install, a whole job's secrets, each cloud's SDK path, the memory tier) say
    `store_incidental` and run once, on the first."""
    if os.environ.get("RESPAWN_TEST_SCOPE") != "store":
        return
    keep, drop = [], []
    for item in items:
        uses = STORE_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("django_db") \
            or item.get_closest_marker("store")
        (keep if uses and not item.get_closest_marker("store_incidental") else drop).append(item)
    config.hook.pytest_deselected(items=drop)
    items[:] = keep


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    # One test database per pytest process, so concurrent runs never share one.
    from pytest_django.fixtures import _set_suffix_to_test_databases

    _set_suffix_to_test_databases(suffix=f"pid{os.getpid()}")


@pytest.fixture(autouse=True, scope="session")
def private_broker_keys():
    """One broker key prefix per pytest process, as one database: concurrent runs sharing
    a Redis never run each other's tasks (a worker of one run took another's launches).
    Set here for this process's Celery app and, through the environment, for children."""
    from respawn_server.celery import app

    prefix = f"respawn-test-pid{os.getpid()}:"
    os.environ["RESPAWN_BROKER_KEY_PREFIX"] = prefix
    app.conf.broker_transport_options = {**app.conf.broker_transport_options, "global_keyprefix": prefix}


@pytest.fixture(autouse=True, scope="session")
def fast_password_hashing():
    # PBKDF2's deliberate slowness would dominate the suite's run time.
    from django.conf import settings

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def fresh_cache():
    # The cache holds counters (/metrics' task failures) that one test must not leave to
    # the next. Only this process's own memory is cleared, never a shared Redis.
    from django.core.cache import caches
    from django.core.cache.backends.locmem import LocMemCache

    if isinstance(caches["default"], LocMemCache):
        caches["default"].clear()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def team_setup(db):
    return make_team_with_members()


def test_database_url() -> str:
    """A URL for child processes that points at the database this test uses."""
    from django.db import connection

    settings_dict = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{settings_dict['NAME']}"
    user = settings_dict["USER"]
    host = settings_dict["HOST"] or "127.0.0.1"
    port = settings_dict["PORT"] or 5432
    password = f":{settings_dict['PASSWORD']}" if settings_dict["PASSWORD"] else ""
    return f"postgres://{user}{password}@{host}:{port}/{settings_dict['NAME']}"


def searchable_by_vms(path: Path) -> None:
    """Run as root, local VMs run as users of their own (respawn_server.jobs.fleet.providers.local):
    they pass through pytest's private temporary folders to their own directories as
    they pass through a checkout's var/, with the search bit only (they list nothing)."""
    if os.geteuid() == 0:
        for folder in (path, *path.parents):
            folder.chmod(folder.stat().st_mode | stat.S_IXOTH)


def writable_by_vms(path: Path) -> Path:
    """A file a test's jobs append to outside their own folders (a run counter): run as
    root, every local VM is a user of its own, and only this lets them."""
    path.touch()
    path.chmod(0o666)
    return path


FAST_LIVENESS = {"RESPAWN_HEARTBEAT_INTERVAL_S": "0.2", "RESPAWN_HEARTBEAT_TIMEOUT_S": "1.0",
                 "RESPAWN_RECONCILE_INTERVAL_S": "0.2"}


@pytest.fixture
def liveness() -> dict[str, str]:
    """How fast this test's control plane judges its VMs alive: heartbeats and timeouts in
    fractions of a second. A module whose runs need more slack overrides this fixture, so
    the web server (which sets each heartbeat's deadline), the worker and the agents all
    run on the same figures: a timeout given to the worker alone changes no deadline."""
    return FAST_LIVENESS


@pytest.fixture
def child_env(transactional_db, tmp_path, liveness):
    """Environment for real child processes (web, worker, agent) sharing this
    test's database, with the liveness figures of the `liveness` fixture."""
    searchable_by_vms(tmp_path)
    env = dict(os.environ)
    env.update(
        DATABASE_URL=test_database_url(),
        RESPAWN_VAR_DIR=str(tmp_path / "var"),
        PYTHONUNBUFFERED="1",
        **liveness,
    )
    if not env.get("CELERY_BROKER_URL", "").startswith("redis"):
        # The children's var dir is this test's, but their queue is the one this process
        # enqueues into.
        from django.conf import settings

        env["CELERY_BROKER_URL"] = "filesystem://"
        env["RESPAWN_BROKER_DIR"] = str(Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"]).parent)
    purge_queued_tasks()
    yield env
    # Local "VMs" are detached on purpose (they outlive workers): end them here.
    vm_root = tmp_path / "var" / "local-vms"
    if vm_root.exists():
        from respawn_server.jobs.fleet.providers.local import LocalConfig, LocalProvider

        LocalProvider(LocalConfig(root=str(vm_root))).terminate_all()


def share_secrets_key(env: dict, settings) -> dict:
    """`env` with a fresh secrets key that this test's process uses too, so a value one
    of them seals the others open (each var dir would make a key of its own)."""
    env["RESPAWN_SECRETS_KEY"] = Fernet.generate_key().decode()
    settings.RESPAWN = {**settings.RESPAWN, "SECRETS_KEY": env["RESPAWN_SECRETS_KEY"]}
    return env


def purge_queued_tasks() -> None:
    """Drop what earlier tests left queued: a task about their rows must not run in this test's workers."""
    from respawn_server.celery import app

    app.control.purge()


class ChildProcess:
    """A real process of ours, with its output in a file for post-mortems."""

    def __init__(self, argv: list[str], env: dict, log_path: Path):
        self.argv, self.env, self.log_path = argv, env, log_path
        self.proc: subprocess.Popen | None = None

    def start(self):
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv, env=self.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        return self

    def stop(self, sig=15, timeout=10.0):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


class WebServer(ChildProcess):
    def __init__(self, env: dict, log_path: Path, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**env, "RESPAWN_API_URL": self.url}
        super().__init__([sys.executable, "-m", "gunicorn", "respawn_server.wsgi", "-b", f"127.0.0.1:{self.port}",
                          "--workers", "1", "--threads", "8", "--graceful-timeout", "2"], env, log_path)

    def start(self):
        super().start()
        wait_until(self._serving, timeout=30, what=f"web server on {self.url}", proc=self)
        return self

    def _serving(self) -> bool:
        try:
            return requests.get(self.url + "/healthz", timeout=1).ok
        except requests.RequestException:
            return False


def wait_until(predicate, *, timeout: float, what: str, proc: ChildProcess | None = None, interval: float = 0.05,
               explain=None):
    """Poll `predicate` (a recorded outcome, not a duration) until true. On a timeout the
    failure carries `explain()` (what the system recorded meanwhile) and `proc`'s output."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.proc is not None and proc.proc.poll() is not None:
            raise AssertionError(f"{what}: process exited with {proc.proc.returncode}\n{proc.output()[-4000:]}")
        time.sleep(interval)
    detail = f"\n{explain()}" if explain is not None else ""
    detail += f"\n{proc.output()[-4000:]}" if proc is not None else ""
    raise AssertionError(f"timed out waiting for {what}{detail}")


@pytest.fixture
def web_server(child_env, tmp_path):
    server = WebServer(child_env, tmp_path / "web.log").start()
    yield server
    server.stop()


CELERY = [sys.executable, "-m", "celery", "-A", "respawn_server"]


def celery_worker(env: dict, log_path: Path, *, pool: str = "threads", concurrency: int | None = 4,
                  loglevel: str = "INFO") -> ChildProcess:
    """A real Celery worker of the control plane, not started yet (`concurrency` None: the pool's own)."""
    sizing = ["--concurrency", str(concurrency)] if concurrency is not None else []
    return ChildProcess([*CELERY, "worker", "--pool", pool, *sizing, "--loglevel", loglevel, "--without-heartbeat",
                         "--without-gossip", "--without-mingle"], env, log_path)


def start_worker_and_beat(env: dict, tmp_path: Path, *, pool: str = "threads", concurrency: int | None = 4,
                          loglevel: str = "INFO") -> tuple[ChildProcess, ChildProcess]:
    """A started Celery worker and beat (logs: worker.log, beat.log in `tmp_path`); stop beat, then the worker."""
    worker = celery_worker(env, tmp_path / "worker.log", pool=pool, concurrency=concurrency, loglevel=loglevel).start()
    beat = ChildProcess([*CELERY, "beat", "--loglevel", loglevel, "-s", str(tmp_path / "beat")], env,
                        tmp_path / "beat.log").start()
    return worker, beat
