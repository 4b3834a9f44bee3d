"""`respawn submit --workdir DIR`, run as a user would against a live control plane: the
directory goes up once as a content-addressed archive, a second submit of the same tree
sends nothing, and a missing or oversized directory fails before anything is sent."""

import os
import pty
import re
import subprocess

import pytest

from respawn_server.jobs.models import Job, SourceArchive
from tests.agent.archives import user_workdir
from tests.cli.test_cli_live import RESPAWN, cli, job_file  # noqa: F401  (cli: a fixture)

pytestmark = pytest.mark.store_incidental

JOB = "team: vision\nname: from-workdir\ncommand: [python, train.py]\n"
SERVER_MAX_BYTES = 4 * 1024 * 1024


@pytest.fixture
def child_env(child_env):
    """A control plane with a smaller limit than the CLI's default (100 MiB)."""
    child_env["RESPAWN_SOURCE_MAX_BYTES"] = str(SERVER_MAX_BYTES)
    return child_env


def stored_files(tmp_path) -> list:
    return sorted((tmp_path / "var" / "sources" / "sha256").rglob("*.tar.gz"))


def submitted(result) -> Job:
    assert result.returncode == 0, result.stderr
    return Job.objects.get(pk=int(re.search(r"submitted job (\d+)", result.stdout)[1]))


def test_a_workdir_is_uploaded_once_and_a_second_submit_of_the_same_tree_sends_nothing(cli, tmp_path):
    workdir = user_workdir(tmp_path / "project")
    first = cli("submit", str(job_file(tmp_path, JOB)), "--workdir", str(workdir))
    job = submitted(first)
    archive = SourceArchive.objects.get()
    assert job.source_archive == archive and archive.files == 4  # data/ stayed out (.gitignore)
    assert "uploaded 4 files" in first.stderr and f"sha256:{archive.sha256}" in first.stderr
    assert "uploading" not in first.stderr  # no progress bar when stderr is not a terminal
    assert [p.name for p in stored_files(tmp_path)] == [f"{archive.sha256}.tar.gz"]
    before = stored_files(tmp_path)[0].stat().st_mtime_ns

    (workdir / "data" / "shard-1.bin").write_bytes(b"\1" * 100)  # ignored: the same tree for the archive
    os.utime(workdir / "train.py", (1_600_000_000, 1_600_000_000))
    again = cli("submit", str(job_file(tmp_path, JOB)), "--workdir", str(workdir))
    assert submitted(again).source_archive == archive and SourceArchive.objects.count() == 1
    assert f"source sha256:{archive.sha256} is already uploaded; not sending it again" in again.stderr
    assert stored_files(tmp_path)[0].stat().st_mtime_ns == before


def test_a_missing_workdir_fails_before_anything_is_sent(cli, tmp_path):
    result = cli("submit", str(job_file(tmp_path, JOB)), "--workdir", str(tmp_path / "nowhere"))
    assert result.returncode == 2
    assert f"--workdir {tmp_path / 'nowhere'}: no such directory; nothing was uploaded or submitted" in result.stderr
    assert not Job.objects.exists() and not SourceArchive.objects.exists()


def test_an_oversized_workdir_fails_in_the_cli_naming_its_largest_files(cli, tmp_path):
    workdir = user_workdir(tmp_path / "project")
    (workdir / "checkpoint.pt").write_bytes(b"\0" * 50_000)
    result = cli("submit", str(job_file(tmp_path, JOB)), "--workdir", str(workdir),
                 env={"RESPAWN_SOURCE_MAX_BYTES": "20000"})
    assert result.returncode == 2, result.stderr
    assert re.search(r"its files add up to 4\d\.\d KiB, over the limit of 19\.5 KiB \(RESPAWN_SOURCE_MAX_BYTES\)",
                     result.stderr), result.stderr
    assert "Largest: checkpoint.pt" in result.stderr and ".respawnignore" in result.stderr
    assert not Job.objects.exists() and not SourceArchive.objects.exists() and stored_files(tmp_path) == []


def test_a_workdir_within_the_clis_limit_but_over_the_servers_is_not_sent(cli, tmp_path):
    # The server's limit comes in its answer to the ask, before any upload.
    workdir = user_workdir(tmp_path / "project")
    (workdir / "weights.bin").write_bytes(os.urandom(SERVER_MAX_BYTES + 1))
    result = cli("submit", str(job_file(tmp_path, JOB)), "--workdir", str(workdir))
    assert result.returncode == 2, result.stderr
    assert "over the control plane's limit of 4.0 MiB; nothing was uploaded or submitted" in result.stderr
    assert not SourceArchive.objects.exists() and stored_files(tmp_path) == []


def test_the_job_file_and_workdir_cannot_both_name_the_code(cli, tmp_path):
    path = job_file(tmp_path, JOB + "source_git_url: https://example.com/r.git\n")
    result = cli("submit", str(path), "--workdir", str(user_workdir(tmp_path / "project")))
    assert result.returncode == 2 and f"{path}:4: field 'source_git_url' names the job's code" in result.stderr


def test_dry_run_builds_the_archive_and_sends_nothing(cli, tmp_path):
    result = cli("submit", str(job_file(tmp_path, JOB)), "--workdir", str(user_workdir(tmp_path / "project")),
                 "--dry-run")
    assert result.returncode == 0, result.stderr
    assert re.search(r"--workdir: 4 files, \d+ bytes as sha256:[0-9a-f]{64} \(not submitted", result.stdout)
    assert not SourceArchive.objects.exists()


def test_the_upload_draws_a_progress_bar_on_a_terminal(cli, tmp_path):
    workdir = user_workdir(tmp_path / "project")
    (workdir / "weights.bin").write_bytes(os.urandom(3 * 1024 * 1024))  # several chunks of the bar
    main, terminal = pty.openpty()
    env = {**cli.base_env, "RESPAWN_URL": cli.url, "RESPAWN_TOKEN": cli.setup.people["member"].token}
    proc = subprocess.Popen([str(RESPAWN), "submit", str(job_file(tmp_path, JOB)), "--workdir", str(workdir)],
                            env=env, stdout=subprocess.PIPE, stderr=terminal, text=True)
    os.close(terminal)
    drawn = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the terminal's other end closed: the CLI has exited
            break
        if not chunk:
            break
        drawn += chunk
    out, _ = proc.communicate(timeout=60)
    os.close(main)
    assert proc.returncode == 0 and "submitted job" in out, drawn
    frames = drawn.decode().split("\r")
    assert any("uploading sha256:" in f and "100%" in f and "3.0 MiB of 3.0 MiB" in f for f in frames), frames
    assert any(re.search(r"\[#* +\]\s+\d{1,2}%", f) for f in frames), frames  # drawn part way, not just at the end
