"""`respawn submit --secret/--secret-from-env` (issue 17 item 5): the values reach the
server once, encrypted there, and no output of the CLI holds them, before or after."""

import json
import re

import pytest

from respawn_server.jobs.core import secret_env
from respawn_server.jobs.models import Job
from tests.cli.test_cli_live import cli, job_file  # noqa: F401 (fixtures)
from tests.conftest import share_secrets_key

SECRET = "hf_cli-s3cr3t-0123456789"


@pytest.fixture
def child_env(child_env, settings):
    """The server and this test share one secrets key."""
    return share_secrets_key(child_env, settings)


JOB = "team: vision\nname: llm\ncommand: [python, train.py]\nenv:\n  BATCH: \"8\"\n"


def test_secrets_from_the_shell_and_the_command_line_are_stored_encrypted_and_never_printed(cli, tmp_path):
    path = job_file(tmp_path, JOB)
    dry = cli("submit", str(path), "--dry-run", "--json", "--secret-from-env", "HF_TOKEN", env={"HF_TOKEN": SECRET})
    assert dry.returncode == 0 and json.loads(dry.stdout)["secret_env"] == {"HF_TOKEN": None}, dry.stderr
    result = cli("submit", str(path), "--secret-from-env", "HF_TOKEN", "--secret", "WANDB_API_KEY=w-" + SECRET,
                 env={"HF_TOKEN": SECRET})
    assert result.returncode == 0, result.stderr
    job = Job.objects.get(pk=int(re.search(r"submitted job (\d+)", result.stdout)[1]))
    assert secret_env.unseal(job.secret_env) == {"HF_TOKEN": SECRET, "WANDB_API_KEY": "w-" + SECRET}
    shown = cli("show", str(job.pk), "--json")
    assert json.loads(shown.stdout)["secret_env"] == {"HF_TOKEN": None, "WANDB_API_KEY": None}
    for output in (dry, result, shown):
        assert SECRET not in output.stdout + output.stderr


def test_a_missing_or_clashing_secret_is_refused_before_anything_is_sent(cli, tmp_path):
    path = job_file(tmp_path, JOB)
    missing = cli("submit", str(path), "--secret-from-env", "NOT_SET_HERE")
    assert missing.returncode == 2 and "--secret-from-env NOT_SET_HERE: no such variable" in missing.stderr
    clash = cli("submit", str(path), "--secret", "BATCH=" + SECRET)
    assert clash.returncode == 2 and "BATCH: also in the job file's env" in clash.stderr
    shapeless = cli("submit", str(path), "--secret", "HF_TOKEN")
    assert shapeless.returncode == 2 and "give NAME=value" in shapeless.stderr
    assert SECRET not in clash.stderr and not Job.objects.exists()
