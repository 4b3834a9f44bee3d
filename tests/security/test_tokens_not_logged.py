"""No token ever reaches a log: a whole job runs on the local provider (web,
Celery worker and beat, the local VM's supervisor, agent and trainer) at DEBUG
level while people sign in, mint tokens and knock with wrong ones, and no
output of any process holds anything shaped like one of our tokens."""

from __future__ import annotations

import sys

import pytest
import requests

from respawn_server.jobs.core.choices import JobStatus
from respawn_server.jobs.models import Instance, Job
from tests.conftest import start_worker_and_beat, wait_until
from tests.factories import make_job
from tests.security.leaks import tokens_in, tokens_in_database, tokens_in_files

pytestmark = pytest.mark.store_incidental

TRAIN = [sys.executable, "-m", "respawn.examples.tiny", "--steps", "40", "--step-delay", "0.02"]


def people_use_their_tokens(url: str, person) -> list[str]:
    """Sign in, mint, use and misuse tokens through the API; returns every token sent."""
    login = requests.post(url + "/api/v1/auth/token/", json={
        "username": person.user.username, "password": "correct horse battery", "token_name": "cli"}, timeout=10)
    auth = {"Authorization": f"Bearer {person.token}"}
    minted = requests.post(url + "/api/v1/tokens/", json={"name": "ci"}, headers=auth, timeout=10)
    wrong = "rsp_" + "W" * 43  # a wrong token is a secret too: maybe a mistyped real one
    refused = requests.get(url + "/api/v1/jobs/", headers={"Authorization": f"Bearer {wrong}"}, timeout=10)
    agent_refused = requests.post(url + "/api/agent/v1/heartbeat", json={}, timeout=10,
                                  headers={"Authorization": "Bearer rsa_" + "W" * 43})
    assert (login.status_code, minted.status_code, refused.status_code, agent_refused.status_code) == (
        201, 201, 401, 401)
    return [person.token, login.json()["token"], minted.json()["token"], wrong]


@pytest.mark.e2e
def test_no_process_logs_a_token_over_a_whole_job(team_setup, child_env, tmp_path):
    env = {**child_env, "RESPAWN_LOG_LEVEL": "DEBUG", "RESPAWN_LOCAL_MARKET": "none",
           "RESPAWN_RECONCILE_INTERVAL_S": "1"}
    # The server must verify the people's passwords with its own (production) hashers.
    person = team_setup.people["member"]
    from django.contrib.auth.hashers import PBKDF2PasswordHasher

    person.user.password = PBKDF2PasswordHasher().encode("correct horse battery", "tokenlogsalt")
    person.user.save(update_fields=["password"])
    from tests.conftest import WebServer

    web = WebServer(env, tmp_path / "web.log").start()
    env["RESPAWN_API_URL"] = web.url
    job = make_job(team_setup.team, person.user, command=TRAIN, total_steps=40, checkpoint_uri=str(tmp_path / "ckpt"),
                   checkpoint_interval_s=1.0, allowed_clouds=["local"], instance_types=["cpu-small"],
                   validation_model_factory="respawn.examples.tiny:make_model",
                   validation_batch_factory="respawn.examples.tiny:validation_batch")
    worker, beat = start_worker_and_beat(env, tmp_path, concurrency=2, loglevel="DEBUG")
    try:
        sent = people_use_their_tokens(web.url, person)
        wait_until(lambda: Job.objects.get(pk=job.pk).status in JobStatus.TERMINAL, timeout=240,
                   what="the job to finish", proc=worker, interval=0.5)
    finally:
        beat.stop()
        worker.stop()
        web.stop()
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, (job.status, job.status_reason, job.failure_message)
    instance = Instance.objects.get(job=job)
    assert instance.agent_token_hash and instance.last_heartbeat_at  # the agent did register and report
    assert all(tokens_in(t) == [t] for t in sent)
    # Every log of every process, the VM's own files included; only the local VM's
    # launch spec and the bootstrap token's file may hold one: they are its user
    # data, readable on the VM by design (so that token is single-use). And the
    # agent's session file, which keeps its agent token across a restart: owner-only.
    leaked = tokens_in_files(tmp_path, skip=("bootstrap-token", "vm.json", "session.json"))
    assert leaked == [], leaked
    sessions = list(tmp_path.rglob("session.json"))
    assert sessions and all(path.stat().st_mode & 0o777 == 0o600 for path in sessions)
    assert tokens_in_database() == []
