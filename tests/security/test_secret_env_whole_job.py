"""A secret over a whole job on the local provider (issue 17 items 5 and 6): the
trainer finds it in its environment, and nothing else does: no log of any process,
no file of the VM but the agent's own session (its user's alone), no row but the
job's encrypted one. Run as root, the trainer reads none of the worker's keys."""

from __future__ import annotations

import hashlib
import os
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest
import requests
from django.db import connection

from respawn_server.jobs.core.choices import JobStatus
from respawn_server.jobs.fleet.providers.local import LocalConfig, isolation_off_because
from respawn_server.jobs.models import Job, LogChunk
from tests.conftest import WebServer, start_worker_and_beat, wait_until
from tests.factories import make_team_with_members

pytestmark = pytest.mark.store_incidental

SECRET = "hf_whole-job-s3cr3t-0123456789"
PROBE = Path(__file__).with_name("secret_probe.py")


def rows_holding(text: str) -> list[tuple[str, str]]:
    """(table, column) of every value in the database that holds `text`, read as text."""
    found = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            qn = connection.ops.quote_name
            for column in (c.name for c in connection.introspection.get_table_description(cursor, table)):
                cursor.execute(f"SELECT 1 FROM {qn(table)} WHERE CAST({qn(column)} AS TEXT) LIKE %s", [f"%{text}%"])
                found += [(table, column)] * len(cursor.fetchall())
    return found


@pytest.mark.e2e
def test_only_the_trainer_sees_a_secret_over_a_whole_job(child_env, tmp_path):
    env = {**child_env, "RESPAWN_LOG_LEVEL": "DEBUG", "RESPAWN_LOCAL_MARKET": "none", "RESPAWN_RECONCILE_INTERVAL_S": "1"}
    worker_var = Path(env["RESPAWN_VAR_DIR"])
    setup = make_team_with_members()
    with ExitStack() as running:  # stopped in reverse: beat, worker, web
        web = WebServer(env, tmp_path / "web.log").start()
        running.callback(web.stop)
        env["RESPAWN_API_URL"] = web.url
        worker, beat = start_worker_and_beat(env, tmp_path, concurrency=2, loglevel="DEBUG")
        running.callback(worker.stop)
        running.callback(beat.stop)
        answer = requests.post(web.url + "/api/v1/jobs/", headers={"Authorization": f"Bearer {setup.people['member'].token}"},
                               timeout=30, json={
            "team": setup.team.pk, "name": "secret", "total_steps": 30, "checkpoint_uri": str(tmp_path / "ckpt"),
            "checkpoint_interval_s": 1.0, "allowed_clouds": ["local"], "instance_types": ["cpu-small"],
            "command": [sys.executable, str(PROBE), hashlib.sha256(SECRET.encode()).hexdigest(),
                        str(worker_var / "secret_key"), str(worker_var / "secrets.key")],
            "env": {"BATCH": "8"}, "secret_env": {"HF_TOKEN": SECRET}, "max_restarts": 0})
        assert answer.status_code == 201 and SECRET not in answer.text, answer.text
        job = Job.objects.get(pk=answer.json()["id"])
        wait_until(lambda: Job.objects.get(pk=job.pk).status in JobStatus.TERMINAL, timeout=240,
                   what="the job to finish", proc=worker, interval=0.5)
    job.refresh_from_db()
    log = "\n".join(line for chunk in LogChunk.objects.filter(instance__job=job) for line in chunk.lines)
    assert job.status == JobStatus.SUCCEEDED, (job.status, job.failure_message, log[-3000:])
    assert "HF_TOKEN matches" in log and " HF_TOKEN " in log.split("environment names:")[1].splitlines()[0] + " "
    if os.geteuid() == 0 and not isolation_off_because(LocalConfig(root="unused")):  # the VM runs as a user of its own
        assert f"read {worker_var / 'secret_key'}: PermissionError" in log, log[-3000:]
        assert f"read {worker_var / 'secrets.key'}: PermissionError" in log, log[-3000:]
    # The agent's session file keeps the register answer on the VM, as a cloud VM's disk
    # does: owner-only, its user's. Nothing else anywhere holds the value.
    sessions = list(tmp_path.rglob("session.json"))
    assert sessions and all(path.stat().st_mode & 0o777 == 0o600 for path in sessions)
    files = [path for path in tmp_path.rglob("*") if path.is_file() and path.name != "session.json"]
    assert [str(path) for path in files if SECRET.encode() in path.read_bytes()] == []
    assert any(path.name == "vm.json" for path in files) and any(path.name == "agent.log" for path in files)
    assert rows_holding(SECRET) == [] and ("jobs_job", "secret_env") in rows_holding("HF_TOKEN")
