"""Configuration: the embedded default needs no server, production settings pass
Django's deploy checks, migrations match the models, and `make demo`'s seed
gives a token that lists the demo job."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.conftest import ROOT

CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CELERY_", "DJANGO_", "RESPAWN_"))}


def manage(*args, env=None, check=True):
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env or CLEAN_ENV,
                          capture_output=True, text=True, check=check, timeout=120)


def settings_value(expr: str, env: dict) -> str:
    code = f"import django; django.setup(); from django.conf import settings; print({expr})"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**env, "DJANGO_SETTINGS_MODULE":
                          "respawn_server.settings"}, capture_output=True, text=True, check=True).stdout.strip()


def test_no_variables_means_sqlite_wal_and_a_serverless_broker(tmp_path):
    env = {**CLEAN_ENV, "RESPAWN_VAR_DIR": str(tmp_path)}
    assert settings_value("settings.DATABASES['default']['ENGINE']", env) == "django.db.backends.sqlite3"
    assert settings_value("settings.CELERY_BROKER_URL", env) == "filesystem://"
    assert "journal_mode=WAL" in settings_value("settings.DATABASES['default']['OPTIONS']['init_command']", env)


def test_production_variables_select_postgres_and_redis_with_short_visibility(tmp_path):
    env = {**CLEAN_ENV, "RESPAWN_VAR_DIR": str(tmp_path), "DATABASE_URL": "postgres://u@db:5432/respawn",
           "CELERY_BROKER_URL": "redis://redis:6379/0"}
    assert settings_value("settings.DATABASES['default']['ENGINE']", env) == "django.db.backends.postgresql"
    assert settings_value("settings.CELERY_BROKER_TRANSPORT_OPTIONS['visibility_timeout']", env) == "300"
    assert settings_value("settings.CELERY_TASK_ACKS_LATE", env) == "True"
    assert settings_value("settings.DATABASES['default'].get('OPTIONS', {}).get('prepare_threshold', 'unset')",
                          env) == "unset"  # the heartbeat prepares its statement
    behind_pgbouncer = {**env, "RESPAWN_DB_PREPARED_STATEMENTS": "off"}
    assert settings_value("settings.DATABASES['default']['OPTIONS']['prepare_threshold']", behind_pgbouncer) == "None"


def test_migrations_match_the_models(tmp_path):
    manage("makemigrations", "--check", "--dry-run", env={**CLEAN_ENV, "RESPAWN_VAR_DIR": str(tmp_path)})


def test_deploy_checks_are_clean_with_production_settings(tmp_path):
    env = {**CLEAN_ENV, "RESPAWN_VAR_DIR": str(tmp_path), "DJANGO_SECRET_KEY": "x" * 64 + "-Production-Key-1",
           "DJANGO_ALLOWED_HOSTS": "respawn.example.com", "DJANGO_HSTS_SECONDS": "31536000",
           "DJANGO_SECURE_SSL_REDIRECT": "true"}
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=env, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_secret_key_can_come_from_a_file(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("from-a-file-" + "k" * 50)
    env = {**CLEAN_ENV, "RESPAWN_VAR_DIR": str(tmp_path), "DJANGO_SECRET_KEY_FILE": str(key_file)}
    assert settings_value("settings.SECRET_KEY", env) == key_file.read_text()


@pytest.mark.e2e
def test_demo_seed_prints_a_token_that_lists_the_demo_job(tmp_path):
    env = {**CLEAN_ENV, "RESPAWN_VAR_DIR": str(tmp_path)}
    out = manage("demo", "--no-serve", env=env).stdout
    token = re.search(r"API token \(shown once\): (\S+)", out).group(1)
    from tests.conftest import WebServer

    server = WebServer(env, tmp_path / "web.log").start()
    try:
        jobs = requests.get(server.url + "/api/v1/jobs/", headers={"Authorization": f"Bearer {token}"}, timeout=5)
    finally:
        server.stop()
    assert jobs.status_code == 200
    assert [j["name"] for j in jobs.json()["results"]] == ["demo: tiny classifier"]
    assert Path(tmp_path / "respawn.sqlite3").exists()


def test_a_test_run_keeps_out_of_the_repositorys_var_dir():
    # `make demo` keeps its database and queue in the repository's var/: a test's queued
    # `schedule` there would be run by the next demo's worker.
    from django.conf import settings

    repository_var = ROOT / "var"
    assert not settings.VAR_DIR.resolve().is_relative_to(repository_var.resolve())
    written = (settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("data_folder_in", ""),
               settings.RESPAWN["DEFAULT_CHECKPOINT_URI"], settings.PROVIDER_CONFIG["local"]["root"])
    assert not [folder for folder in written if str(folder).startswith(str(repository_var))]


def test_a_bad_local_preemption_limit_stops_start_up_naming_the_variable(tmp_path):
    env = {**CLEAN_ENV, "RESPAWN_VAR_DIR": str(tmp_path)}
    assert settings_value("settings.PROVIDER_CONFIG['local']['market_max_preemptions']",
                          {**env, "RESPAWN_LOCAL_MAX_PREEMPTIONS": "3"}) == "3"
    done = manage("check", env={**env, "RESPAWN_LOCAL_MAX_PREEMPTIONS": "three"}, check=False)
    assert done.returncode != 0 and "RESPAWN_LOCAL_MAX_PREEMPTIONS must be a whole number >= 0, got 'three'" in done.stderr
