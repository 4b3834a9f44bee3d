"""A user's code reaches the VM, end to end on the local provider: `respawn submit --workdir`
uploads a directory whose training script exists nowhere else, a Celery worker launches a
local VM, its agent fetches the archive, checks its digest and unpacks it, and the job
succeeds running that script. Real processes throughout: the CLI, gunicorn, a Celery
worker, a detached local VM running the agent."""

import re
import subprocess
import sys

import pytest

from respawn_server.jobs.core.choices import JobStatus
from respawn_server.jobs.models import Job, SourceArchive
from tests.agent.archives import user_workdir
from tests.cli.test_cli_live import RESPAWN
from tests.conftest import celery_worker, wait_until
from tests.factories import make_team_with_members
from tests.local_provider.helpers import FAST_AGENT_ENV

pytestmark = pytest.mark.e2e


@pytest.fixture
def control_plane(child_env, web_server, tmp_path):
    env = {**child_env, **FAST_AGENT_ENV, "RESPAWN_API_URL": web_server.url, "RESPAWN_LOCAL_MARKET": "none"}
    worker = celery_worker(env, tmp_path / "worker.log").start()
    yield worker
    worker.stop()


@pytest.mark.timeout(300)
def test_a_job_runs_a_script_that_exists_only_in_the_uploaded_workdir(control_plane, web_server, tmp_path):
    setup = make_team_with_members()
    workdir = user_workdir(tmp_path / "laptop" / "project")
    spec = tmp_path / "job.yaml"
    spec.write_text(f"team: vision\nname: shipped\ncommand: ['{sys.executable}', train.py]\ntotal_steps: 3\n"
                    f"checkpoint_uri: {tmp_path / 'ckpt'}\nallowed_clouds: [local]\ninstance_types: [cpu-small]\n")
    submitted = subprocess.run(
        [str(RESPAWN), "submit", str(spec), "--workdir", str(workdir)], capture_output=True, text=True, timeout=60,
        cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "RESPAWN_URL": web_server.url,
                           "RESPAWN_TOKEN": setup.people["member"].token})
    assert submitted.returncode == 0, submitted.stderr
    job = Job.objects.get(pk=int(re.search(r"submitted job (\d+)", submitted.stdout)[1]))
    assert not list((tmp_path / "var").rglob("train.py"))  # nowhere on the control plane's side, unpacked

    wait_until(lambda: Job.objects.get(pk=job.pk).status in JobStatus.TERMINAL, timeout=150, what="the job to finish",
               proc=control_plane, interval=0.2)
    job.refresh_from_db()
    lines = [line for i in job.instances.all() for chunk in i.log_chunks.order_by("offset") for line in chunk.lines]
    assert job.status == JobStatus.SUCCEEDED, (job.status_reason, job.failure_message, lines[-20:])
    assert job.source_archive == SourceArchive.objects.get() and job.last_step == 3
    said = "\n".join(lines)
    assert f"putting the job's code in place: source archive sha256:{job.source_archive.sha256}" in said
    assert re.search(r"hello from the uploaded workdir from \S+/source$", said, re.M), said
