"""The job's code on the VM: a real agent fetches the archive the job names from the real
control plane (uploaded through its API), checks the digest register pinned, unpacks it
into working_dir and runs the trainer there; or clones a git commit from a bare
repository (file://). A tampered or hostile archive, or a commit that is not there, is
the job's setup failure with the reason, before any training."""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from respawn.metadata_server import MetadataServer
from respawn_server.jobs.core.choices import JobStatus
from respawn_server.jobs.models import Job, SourceArchive
from respawn.cli import workdir
from tests.agent.archives import header_bomb, hostile_tar, user_workdir
from tests.agent.live import AgentProcess
from tests.conftest import wait_until
from tests.factories import make_instance, make_job

pytestmark = [pytest.mark.e2e, pytest.mark.store_incidental]


def upload(server_url: str, person, team, archive: workdir.Archive) -> None:
    with open(archive.path, "rb") as body:
        answer = requests.put(f"{server_url}/api/v1/sources/{archive.digest}/", params={"team": team.pk}, data=body,
                              headers={"Authorization": f"Bearer {person.token}", "Content-Type": "application/gzip"},
                              timeout=30)
    assert answer.status_code == 201, answer.text


def stored(tmp_path: Path, sha256: str) -> Path:
    """Where the web server (var dir tmp_path/var) keeps an archive."""
    return tmp_path / "var" / "sources" / "sha256" / sha256[:2] / f"{sha256}.tar.gz"


def accepted_before(tmp_path: Path, team, archive: Path, sha256: str) -> SourceArchive:
    """`archive` stored as if an older control plane had accepted it: the VM checks for itself."""
    stored(tmp_path, sha256).parent.mkdir(parents=True)
    archive.rename(stored(tmp_path, sha256))
    return SourceArchive.objects.create(team=team, sha256=sha256, bytes=1, unpacked_bytes=1, files=2)


def source_job(team_setup, tmp_path, **fields) -> Job:
    return make_job(team_setup.team, team_setup.people["member"].user, status=JobStatus.PROVISIONING,
                    checkpoint_uri=str(tmp_path / "ckpt"), command=[sys.executable, "train.py"], total_steps=3,
                    **fields)


@contextmanager
def vm_of(job, child_env, web_server, tmp_path):
    """A VM of `job`'s first instance: each call of what it yields starts its agent, on the
    same work dir (a second start is the agent restarted on that VM)."""
    instance = make_instance(job)
    imds = MetadataServer("aws").start()
    try:
        yield lambda: AgentProcess({**child_env, "RESPAWN_VALIDATE": "0"}, tmp_path, url=web_server.url,
                                   bootstrap_token=instance.bootstrap_token, provider="aws",
                                   metadata_url=imds.url).start()
    finally:
        imds.stop()


def run_until(agent: AgentProcess, done, what: str) -> AgentProcess:
    try:
        wait_until(done, timeout=90, what=what, proc=agent, interval=0.2)
    finally:
        agent.stop(9)
    return agent


def finished(job) -> bool:
    return Job.objects.get(pk=job.pk).status in JobStatus.TERMINAL


def run_job(team_setup, child_env, web_server, tmp_path, **fields) -> tuple[Job, AgentProcess]:
    job = source_job(team_setup, tmp_path, **fields)
    with vm_of(job, child_env, web_server, tmp_path) as start_agent:
        agent = run_until(start_agent(), lambda: finished(job), "the job to finish")
    job.refresh_from_db()
    return job, agent


def output(job) -> str:
    return "\n".join(line for i in job.instances.all() for chunk in i.log_chunks.order_by("offset") for line in chunk.lines)


@pytest.mark.parametrize("where", ["agent's", "job's"])
def test_the_trainer_runs_code_that_exists_only_in_the_uploaded_archive(where, team_setup, child_env, web_server,
                                                                        tmp_path):
    archive = workdir.build(user_workdir(tmp_path / "laptop"), 10**6)
    upload(web_server.url, team_setup.people["member"], team_setup.team, archive)
    code = tmp_path / "vm" / "code"
    job, agent = run_job(team_setup, child_env, web_server, tmp_path, working_dir=str(code) if where == "job's" else "",
                         source_archive=SourceArchive.objects.get(sha256=archive.sha256))
    said = output(job)
    assert job.status == JobStatus.SUCCEEDED, (job.status_reason, job.failure_message, said, agent.output()[-2000:])
    unpacked = code if where == "job's" else agent.work_dir / "source"
    assert f"hello from the uploaded workdir from {unpacked}" in said
    assert (unpacked / "configs" / "current.yaml").read_text() == "lr: 0.1\n" and not (unpacked / "data").exists()


def test_a_tampered_archive_fails_the_job_as_setup_with_the_reason_and_no_training(team_setup, child_env, web_server,
                                                                                   tmp_path):
    archive = workdir.build(user_workdir(tmp_path / "laptop"), 10**6)
    upload(web_server.url, team_setup.people["member"], team_setup.team, archive)
    kept = stored(tmp_path, archive.sha256)
    hostile_tar(kept, ("train.py", "file", b"print('not the code that was uploaded')"))
    job, agent = run_job(team_setup, child_env, web_server, tmp_path,
                         source_archive=SourceArchive.objects.get(sha256=archive.sha256))
    assert (job.status, job.failure_cause) == (JobStatus.FAILED, "setup"), (job.status, job.status_reason)
    assert f"source archive digest mismatch: the job pins sha256:{archive.sha256}" in job.failure_headline
    said = output(job)
    assert "digest mismatch" in said and "not the code" not in said and "hello" not in said
    assert job.instances.count() == 1  # failed for good: no relaunch that would fail (and bill) again
    assert not (agent.work_dir / "source").exists() and not (agent.work_dir / "source.tar.gz").exists()


def test_an_archive_that_would_write_outside_working_dir_is_refused_on_the_vm(team_setup, child_env, web_server,
                                                                               tmp_path):
    evil = tmp_path / "evil.tar.gz"
    sha256 = hostile_tar(evil, ("train.py", "file", b"print('hello')"), ("../../escaped.py", "file", b"pwned"))
    archive = accepted_before(tmp_path, team_setup.team, evil, sha256)
    job, agent = run_job(team_setup, child_env, web_server, tmp_path, source_archive=archive)
    assert (job.status, job.failure_cause) == (JobStatus.FAILED, "setup"), (job.status, job.status_reason)
    assert "cannot be unpacked" in job.failure_headline and "'..'" in job.failure_headline, job.failure_headline
    assert not list(tmp_path.rglob("escaped.py")) and "hello" not in output(job)


def test_an_archive_whose_header_would_take_gigabytes_is_refused_on_the_vm_before_it_is_read(
        team_setup, child_env, web_server, tmp_path):
    # 65 KB of gzip holding a 64 MiB pax header: every VM paid it again at unpack (issue 35).
    bomb = tmp_path / "bomb.tar.gz"
    archive = accepted_before(tmp_path, team_setup.team, bomb, header_bomb(bomb, 64 << 20))
    job, agent = run_job(team_setup, child_env, web_server, tmp_path, source_archive=archive)
    assert (job.status, job.failure_cause) == (JobStatus.FAILED, "setup"), (job.status, job.status_reason)
    assert "cannot be unpacked: a header of 67108864 bytes" in job.failure_headline, job.failure_headline


RUNS_TWICE = """\
import json, os, pathlib, time

first = not pathlib.Path("ran-before").exists()
pathlib.Path("ran-before").touch()
print("first run" if first else "second run, in the same directory")
if first:
    time.sleep(120)  # the agent is killed meanwhile, and this trainer with it
status = os.environ["RESPAWN_STATUS_FILE"]
with open(status + ".tmp", "w") as f:
    json.dump({"step": 3}, f)
os.replace(status + ".tmp", status)
"""


def test_an_agent_restarted_on_its_vm_runs_the_code_it_put_in_place_without_fetching_it_again(
        team_setup, child_env, web_server, tmp_path):
    project = user_workdir(tmp_path / "laptop")
    (project / "train.py").write_text(RUNS_TWICE)
    archive = workdir.build(project, 10**6)
    upload(web_server.url, team_setup.people["member"], team_setup.team, archive)
    job = source_job(team_setup, tmp_path, source_archive=SourceArchive.objects.get(sha256=archive.sha256))
    with vm_of(job, child_env, web_server, tmp_path) as start_agent:
        run_until(start_agent(), lambda: "first run" in output(job), "the first trainer running")
        stored(tmp_path, archive.sha256).unlink()  # fetching again would fail the job
        run_until(start_agent(), lambda: finished(job), "the job to finish")
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, (job.status_reason, job.failure_message, output(job))
    assert "second run, in the same directory" in output(job)


def git(*args: str, cwd: Path) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "HOME": str(cwd), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def bare_repo(tmp_path) -> tuple[str, str]:
    """A file:// URL of a bare repository and the id of a commit that is not its tip."""
    work = user_workdir(tmp_path / "repo")
    git("init", "-q", "-b", "main", cwd=work)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "first", cwd=work)
    first = git("rev-parse", "HEAD", cwd=work)
    (work / "helper.py").write_text("def greeting():\n    return 'hello from a later commit'\n")
    git("commit", "-q", "-am", "second", cwd=work)
    git("clone", "-q", "--bare", str(work), str(tmp_path / "repo.git"), cwd=tmp_path)
    return f"file://{tmp_path / 'repo.git'}", first


def test_a_git_source_is_that_exact_commit_checked_out_in_working_dir(bare_repo, team_setup, child_env, web_server,
                                                                      tmp_path):
    url, first = bare_repo
    job, agent = run_job(team_setup, child_env, web_server, tmp_path, source_git_url=url, source_git_commit=first)
    said = output(job)
    assert job.status == JobStatus.SUCCEEDED, (job.status_reason, job.failure_message, said)
    assert f"hello from the uploaded workdir from {agent.work_dir / 'source'}" in said  # the first commit's helper
    assert git("rev-parse", "HEAD", cwd=agent.work_dir / "source") == first


def test_a_git_commit_that_is_not_there_fails_the_job_as_setup(bare_repo, team_setup, child_env, web_server, tmp_path):
    url, _ = bare_repo
    job, _ = run_job(team_setup, child_env, web_server, tmp_path, source_git_url=url, source_git_commit="f" * 40)
    assert (job.status, job.failure_cause) == (JobStatus.FAILED, "setup"), (job.status, job.status_reason)
    assert "git checkout failed (exit 128): fatal: reference is not a tree" in job.failure_headline, job.failure_headline
    assert "hello" not in output(job)
