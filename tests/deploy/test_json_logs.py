"""RESPAWN_LOG_FORMAT=json: what a log shipper reads, line by line, from a real process."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

EMIT = """
import logging, django
django.setup()
log = logging.getLogger("respawn_server.jobs.fleet.launcher")
log.info("launched %s", "vm-1", extra={"job_id": 7, "instance_id": 12})
try:
    1 / 0
except ZeroDivisionError:
    log.exception("reconcile failed")
"""


def run_with(log_format: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "respawn_server.settings", "RESPAWN_LOG_FORMAT": log_format}
    return subprocess.run([sys.executable, "-c", EMIT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_each_line_is_one_json_object_with_the_extras():
    result = run_with("json")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    assert len(lines) == 2
    first, second = lines
    assert {k: first[k] for k in ("level", "logger", "message", "job_id", "instance_id")} == {
        "level": "INFO", "logger": "respawn_server.jobs.fleet.launcher", "message": "launched vm-1", "job_id": 7, "instance_id": 12}
    assert first["time"].endswith("+00:00")
    assert second["level"] == "ERROR" and "ZeroDivisionError" in second["exception"]


def test_plain_stays_the_default():
    env = {k: v for k, v in os.environ.items() if k != "RESPAWN_LOG_FORMAT"}
    result = subprocess.run([sys.executable, "-c", EMIT], cwd=ROOT, env={**env, "DJANGO_SETTINGS_MODULE": "respawn_server.settings"},
                            capture_output=True, text=True, timeout=60)
    assert " INFO respawn_server.jobs.fleet.launcher: launched vm-1" in result.stderr.splitlines()[0]


def test_an_unknown_format_is_refused_by_name():
    result = run_with("xml")
    assert result.returncode != 0
    assert "RESPAWN_LOG_FORMAT must be 'plain' or 'json', not 'xml'" in result.stderr
