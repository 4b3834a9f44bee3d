"""PostgreSQL stops mid-run and comes back. The whole stack (web, worker, beat)
runs on the test's own cluster, so it can be stopped without touching anyone
else's: agents' reports fail while it is down and replay from their offline
journal, none is lost or applied twice, no instance is wrongly marked lost, and
the job ends with the uninterrupted weights."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chaos import stack
from tests.conftest import ROOT, WebServer, searchable_by_vms, start_worker_and_beat, wait_until
from tests.postgres_cluster import PostgresCluster


@pytest.fixture
def cluster():
    pg = PostgresCluster().init().start()
    yield pg
    pg.remove()


def django(env: dict, code: str) -> str:
    """Run `code` in a Django process of the stack (its ORM, its database) and return what it prints."""
    done = subprocess.run([sys.executable, "-c", f"import django; django.setup()\n{code}"], cwd=ROOT,
                          env={**env, "DJANGO_SETTINGS_MODULE": "respawn_server.settings"}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def job_row(cluster, job_id):
    return cluster.query("SELECT status, artifact_digest, status_reason FROM jobs_job WHERE id = %s", job_id)[0]


@pytest.mark.e2e
def test_postgres_restarted_mid_run_loses_no_report_and_no_instance(cluster, tmp_path, uninterrupted_digest):
    searchable_by_vms(tmp_path)  # its own stack, not child_env's: its VMs pass through to var/ and ckpt/ too
    env = {**os.environ, **stack.STACK_ENV, "DATABASE_URL": cluster.url, "RESPAWN_VAR_DIR": str(tmp_path / "var"),
           "CELERY_BROKER_URL": "filesystem://", "PYTHONUNBUFFERED": "1"}
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=300)
    web = WebServer(env, tmp_path / "web.log").start()
    env["RESPAWN_API_URL"] = web.url
    job_id = int(django(env, "from pathlib import Path\nfrom tests.chaos.stack import create_job\n"
                             f"print(create_job(Path({str(tmp_path / 'ckpt')!r}), step_delay_s=0.1).pk)"))
    worker, beat = start_worker_and_beat(env, tmp_path)
    try:
        def training():
            return cluster.query(
                "SELECT i.id, i.provider_instance_id FROM jobs_instance i"
                " JOIN jobs_checkpoint c ON c.instance_id = i.id"
                " WHERE i.job_id = %s AND i.state = 'running' LIMIT 1", job_id)

        wait_until(training, timeout=stack.JOB_TIMEOUT_S, what="the job training with a checkpoint", proc=worker,
                   interval=0.5)
        ((instance_id, vm_id),) = training()
        agent_log = stack.provider(env).vm_dir(vm_id).agent_log
        failures_before = agent_log.read_text().count("control plane unavailable")
        cluster.stop()
        # Down until agent reports have failed for longer than a heartbeat timeout (5xx: no database).
        wait_until(lambda: agent_log.read_text().count("control plane unavailable") >= failures_before + 8,
                   timeout=60, what="agent reports failing while PostgreSQL is down", proc=worker)
        cluster.start()
        wait_until(lambda: job_row(cluster, job_id)[0] in ("succeeded", "failed", "cancelled"),
                   timeout=stack.JOB_TIMEOUT_S, what="the job to finish", proc=worker, interval=0.5)
    finally:
        beat.stop()
        worker.stop()
        web.stop()
        stack.provider(env).terminate_all()
    status, digest, reason = job_row(cluster, job_id)
    assert (status, digest) == ("succeeded", uninterrupted_digest), reason
    story = "\n".join(f"{at:%H:%M:%S.%f} {message}" for at, message in cluster.query(
        "SELECT created_at, message FROM jobs_jobevent WHERE job_id = %s ORDER BY id", job_id))
    assert cluster.query("SELECT id, end_reason FROM jobs_instance WHERE job_id = %s ORDER BY id", job_id) == \
        [(instance_id, "completed")], f"{story}\nagent.log tail:\n{agent_log.read_text()[-4000:]}"
    assert cluster.query("SELECT count(*) FROM jobs_interruptionevent")[0][0] == 0
    applied = [row[0] for row in cluster.query("SELECT event_id FROM jobs_processedevent WHERE instance_id = %s",
                                               instance_id)]
    stack.assert_reports_applied_once(
        stack.journaled_reports(env, vm_id), applied,
        heartbeats_applied=cluster.query("SELECT count(*) FROM jobs_metricpoint WHERE instance_id = %s",
                                         instance_id)[0][0],
        logs=cluster.query('SELECT "offset", lines FROM jobs_logchunk WHERE instance_id = %s', instance_id))
