"""The installed `respawn` console script, run as a user would, against a live
control plane (gunicorn on the test database)."""

import json
import os
import re
import stat
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.contrib.auth.models import User
from django.utils import timezone

from respawn_server.jobs.core.choices import InstanceState, JobStatus
from respawn_server.jobs.core.transitions import transition_job
from respawn_server.jobs.models import ApiToken, Job, LogChunk
from tests.cli.resetting_proxy import ResettingProxy
from tests.conftest import wait_until
from tests.costs.history import make_history
from tests.factories import make_instance, make_job, make_team_with_members

pytestmark = pytest.mark.store_incidental

RESPAWN = Path(sys.executable).parent / "respawn"  # the console script pip installed next to this Python
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "job-spec.example.yaml"
PASSWORD = "correct horse battery"


@pytest.fixture
def child_env(child_env):
    """A server with the clouds the documented example allows enabled (it refuses others at submit)."""
    child_env["RESPAWN_PROVIDERS"] = "aws,gcp,azure,local"
    return child_env


@pytest.fixture
def cli(web_server, tmp_path):
    """Run `respawn ARGS` with a fresh home directory; signed in through the
    environment as the team's member unless `env` says otherwise."""
    setup = make_team_with_members()
    home = tmp_path / "home"
    home.mkdir()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("RESPAWN_", "XDG_"))}
    base_env["HOME"] = str(home)

    def run(*args, env=None, signed_in=True, stdin=None, timeout=60):
        extra = {"RESPAWN_URL": web_server.url, "RESPAWN_TOKEN": setup.people["member"].token} if signed_in else {}
        return subprocess.run([str(RESPAWN), *args], env={**base_env, **extra, **(env or {})}, cwd=tmp_path,
                              input=stdin, capture_output=True, text=True, timeout=timeout)

    run.setup, run.home, run.url, run.base_env = setup, home, web_server.url, base_env
    return run


def set_password_the_server_can_check(username: str) -> None:
    """The test process hashes with MD5 for speed, which the server does not
    accept; a PBKDF2 hash with few iterations it does, and checks quickly."""
    encoded = PBKDF2PasswordHasher().encode(PASSWORD, "testsalt", iterations=1000)
    User.objects.filter(username=username).update(password=encoded)


def job_file(tmp_path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def test_login_saves_a_private_token_that_later_commands_use(cli):
    set_password_the_server_can_check("vision-member")
    result = cli("login", "--url", cli.url, "--username", "vision-member", "--password-stdin", signed_in=False,
                 stdin=PASSWORD + "\n")
    assert result.returncode == 0, result.stderr
    credentials = cli.home / ".config" / "respawn" / "credentials"
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
    saved = json.loads(credentials.read_text())
    assert saved["url"] == cli.url and ApiToken.objects.filter(user__username="vision-member").count() == 2
    listed = cli("tokens", "--json", signed_in=False)
    assert listed.returncode == 0, listed.stderr
    assert [t["current"] for t in json.loads(listed.stdout) if t["name"].startswith("cli@")] == [True]


def test_a_wrong_password_fails_with_exit_3_and_saves_nothing(cli):
    result = cli("login", "--url", cli.url, "--username", "vision-member", "--password-stdin", signed_in=False,
                 stdin="wrong\n")
    assert result.returncode == 3 and "Wrong username or password" in result.stderr
    assert not (cli.home / ".config" / "respawn" / "credentials").exists()


def test_the_documented_example_is_submitted_with_every_field_and_listed(cli, tmp_path):
    deadline = (timezone.now() + timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    text = re.sub(r"(?m)^deadline: .*$", f"deadline: {deadline}", EXAMPLE.read_text())
    cli.setup.team.max_concurrent_gpus = 16  # the example's 2 nodes of 8
    cli.setup.team.save()
    result = cli("submit", str(job_file(tmp_path, text)))
    assert result.returncode == 0, result.stderr
    job_id = int(re.search(r"submitted job (\d+)", result.stdout)[1])
    job = Job.objects.get(pk=job_id)
    assert (job.team, job.owner.username, job.status) == (cli.setup.team, "vision-member", JobStatus.QUEUED)
    assert job.command[0] == "torchrun" and job.env["NCCL_DEBUG"] == "WARN" and job.post_command[0] == "python"
    assert (job.nodes, job.priority, job.max_restarts, job.validation_tolerance) == (2, 10, 3, 0.0001)
    assert job.machine_image["aws"] == "ami-0123456789abcdef0" and job.container_image == "ghcr.io/example/resnet:2.3"
    listed = cli("ls", "--json", "--status", "queued")
    assert listed.returncode == 0, listed.stderr
    assert [(j["id"], j["name"]) for j in json.loads(listed.stdout)] == [(job_id, "resnet50-imagenet")]
    table = cli("ls")
    assert "resnet50-imagenet" in table.stdout and table.stdout.splitlines()[0].split()[:3] == ["ID", "NAME", "TEAM"]


def test_a_malformed_job_file_is_refused_naming_field_and_line_and_creates_nothing(cli, tmp_path):
    path = job_file(tmp_path, "team: vision\nname: x\ncommand: [python, train.py]\nnodes: many\ngpus: 8\n")
    result = cli("submit", str(path))
    assert result.returncode == 2
    assert f"{path}:4: field 'nodes': must be a whole number" in result.stderr
    assert f"{path}:5: unknown field 'gpus'" in result.stderr and "nothing was submitted" in result.stderr
    assert Job.objects.count() == 0


def test_the_servers_field_errors_are_shown_at_their_line(cli, tmp_path):
    path = job_file(tmp_path, "team: vision\nname: x\ncommand: [python, train.py]\ndeadline: 2020-01-01T00:00:00Z\n")
    result = cli("submit", str(path))
    assert result.returncode == 2
    assert f"{path}:4: field 'deadline': deadline is in the past" in result.stderr
    unknown_team = cli("submit", str(job_file(tmp_path, "team: nlp\nname: x\ncommand: [python, t.py]\n")))
    assert unknown_team.returncode == 2 and "you are in no team 'nlp'; your teams: vision" in unknown_team.stderr
    assert Job.objects.count() == 0


def test_an_expired_token_says_so_and_exits_3(cli):
    ApiToken.objects.filter(user__username="vision-member").update(expires_at=timezone.now() - timedelta(minutes=1))
    result = cli("ls")
    assert result.returncode == 3
    assert "token has expired" in result.stderr and "respawn login" in result.stderr and result.stdout == ""


def test_not_logged_in_and_not_found_have_their_own_exit_codes(cli):
    nobody = cli("ls", signed_in=False)
    assert nobody.returncode == 3 and "not logged in" in nobody.stderr
    other = make_job(cli.setup.other_team, cli.setup.people["outsider"].user)
    missing = cli("show", str(other.pk))
    assert missing.returncode == 4 and "not found" in missing.stderr


def test_show_events_and_cancel(cli):
    job = make_job(cli.setup.team, cli.setup.people["member"].user, name="bert")
    shown = json.loads(cli("show", str(job.pk), "--json").stdout)
    assert shown["name"] == "bert" and shown["status"] == "queued"
    cancelled = cli("cancel", str(job.pk))
    assert cancelled.returncode == 0 and f"job {job.pk}: cancelled" in cancelled.stdout
    again = cli("cancel", str(job.pk))
    assert again.returncode == 1 and "already cancelled" in again.stderr
    history = cli("events", str(job.pk))
    assert history.returncode == 0 and "cancelled by vision-member" in history.stdout


def test_logs_follow_prints_new_lines_and_stops_when_the_job_ends(cli):
    job = make_job(cli.setup.team, cli.setup.people["member"].user, status=JobStatus.RUNNING)
    instance = make_instance(job, state=InstanceState.RUNNING, registered=True).instance
    LogChunk.objects.create(instance=instance, offset=0, lines=["step 1 loss 2.30"])
    env = {**cli.base_env, "RESPAWN_URL": cli.url, "RESPAWN_TOKEN": cli.setup.people["member"].token}
    follower = subprocess.Popen([str(RESPAWN), "logs", str(job.pk), "--follow", "--poll", "0.1", "--max-wait", "60"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert follower.stdout.readline() == "step 1 loss 2.30\n"
        LogChunk.objects.create(instance=instance, offset=1, lines=["step 2 loss 1.90", "done"])
        transition_job(job.pk, JobStatus.RUNNING, JobStatus.SUCCEEDED, message="training completed")
        rest, errors = follower.communicate(timeout=30)
    finally:
        follower.kill()
    assert follower.returncode == 0, errors
    assert rest == "step 2 loss 1.90\ndone\n" and "succeeded" in errors


def test_logs_follow_carries_on_over_dropped_connections_never_repeating_or_skipping_a_line(cli):
    job = make_job(cli.setup.team, cli.setup.people["member"].user, status=JobStatus.RUNNING)
    instance = make_instance(job, state=InstanceState.RUNNING, registered=True).instance
    LogChunk.objects.create(instance=instance, offset=0, lines=["step 1 loss 2.30"])
    with ResettingProxy(cli.url) as proxy:
        env = {**cli.base_env, "RESPAWN_URL": proxy.url, "RESPAWN_TOKEN": cli.setup.people["member"].token}
        follower = subprocess.Popen([str(RESPAWN), "logs", str(job.pk), "--follow", "--poll", "0.1", "--max-wait", "120"],
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert follower.stdout.readline() == "step 1 loss 2.30\n"
            proxy.reset_answers(3)
            LogChunk.objects.create(instance=instance, offset=1, lines=["step 2 loss 1.90", "step 3 loss 1.70"])
            wait_until(lambda: proxy.resets_done == 3, timeout=60, what="three answers cut by a reset")
            LogChunk.objects.create(instance=instance, offset=3, lines=["done"])
            transition_job(job.pk, JobStatus.RUNNING, JobStatus.SUCCEEDED, message="training completed")
            rest, errors = follower.communicate(timeout=60)
        finally:
            follower.kill()
    assert follower.returncode == 0, errors
    assert rest == "step 2 loss 1.90\nstep 3 loss 1.70\ndone\n"
    assert errors.count("trying again in") >= 3 and "succeeded" in errors


def test_logs_follow_gives_up_with_a_clear_message_when_the_connection_keeps_dropping(cli):
    job = make_job(cli.setup.team, cli.setup.people["member"].user, status=JobStatus.RUNNING)
    with ResettingProxy(cli.url) as proxy:
        proxy.reset_answers(None)
        result = cli("logs", str(job.pk), "--follow", "--poll", "0.1", "--retry-for", "1",
                     env={"RESPAWN_URL": proxy.url})
    assert result.returncode == 1 and result.stdout == ""
    assert f"respawn: error: gave up after 1s of trying: cannot reach the control plane at {proxy.url}" in result.stderr


def test_logs_follow_gives_up_after_max_wait_with_exit_1(cli):
    job = make_job(cli.setup.team, cli.setup.people["member"].user, status=JobStatus.RUNNING)
    result = cli("logs", str(job.pk), "--follow", "--poll", "0.1", "--max-wait", "0.3")
    assert result.returncode == 1 and "still running" in result.stderr
    # A job with no output yet is not silent: the follower says so once, first.
    assert result.stderr.startswith(f"-- job {job.pk} is running: the trainer has printed nothing yet")
    assert result.stderr.count("printed nothing yet") == 1 and result.stdout == ""


def test_logs_follow_of_a_real_agent_whose_trainer_prints_nothing_says_so_and_shows_the_agents_own_lines(cli, child_env,
                                                                                                          tmp_path):
    """A real agent whose trainer stays silent: the follower says the trainer has printed
    nothing yet, once, and prints the agent's lines (the trainer started, the validator
    warm), each marked as the agent's, on the CLI and in the API."""
    from respawn.metadata_server import MetadataServer
    from tests.agent.live import AgentProcess, make_running_job

    job, setup = make_running_job(
        cli.setup, tmp_path, validation_model_factory="respawn.examples.tiny:make_model",
        validation_batch_factory="respawn.examples.tiny:validation_batch")
    Job.objects.filter(pk=job.pk).update(command=[sys.executable, "-c", "import time; time.sleep(600)"])
    imds = MetadataServer("aws").start()
    agent = AgentProcess(child_env, tmp_path, url=cli.url, bootstrap_token=setup.bootstrap_token, provider="aws",
                         metadata_url=imds.url).start()
    try:
        wait_until(lambda: any("the validator is warm" in line for chunk in LogChunk.objects.filter(
            instance=setup.instance) for line in chunk.lines), timeout=120, what="the agent's lines shipped", proc=agent)
        result = cli("logs", str(job.pk), "--follow", "--poll", "0.1", "--max-wait", "1")
        page = cli("logs", str(job.pk), "--json")
    finally:
        agent.stop(9)
        imds.stop()
    assert result.returncode == 1 and "still running" in result.stderr  # it runs on, silent: --max-wait ends it
    assert result.stderr.startswith(f"-- job {job.pk} is running") and "the trainer has printed nothing yet" in result.stderr
    assert result.stderr.count("printed nothing yet") == 1
    lines = result.stdout.splitlines()
    assert lines and all(line.startswith("[respawn-agent] ") for line in lines), result.stdout
    assert any("trainer started, pid" in line and "time.sleep(600)" in line for line in lines), result.stdout
    assert any("the validator is warm on cpu" in line for line in lines), result.stdout
    assert {json.loads(line)["agent"] for line in page.stdout.splitlines()} == {True}, page.stdout


def test_tokens_create_list_and_revoke(cli):
    created = cli("tokens", "create", "ci", "--expires-in", "30d", "--json")
    assert created.returncode == 0, created.stderr
    token = json.loads(created.stdout)
    assert token["token"].startswith(token["prefix"]) and token["expires_at"]
    listed = cli("tokens")
    assert "ci" in listed.stdout and "(this one)" in listed.stdout
    assert cli("tokens", "revoke", str(token["id"])).returncode == 0
    with_revoked = cli("ls", env={"RESPAWN_TOKEN": token["token"]})
    assert with_revoked.returncode == 3 and "refused your credentials" in with_revoked.stderr
    bad = cli("tokens", "create", "x", "--expires-in", "soon")
    assert bad.returncode == 2 and "--expires-in" in bad.stderr


def test_cost_shows_spent_savings_and_each_instance(cli):
    job, *_ = make_history(cli.setup.team, cli.setup.people["member"].user)
    table = cli("cost", str(job.pk))
    assert table.returncode == 0, table.stderr
    assert "in US dollars" in table.stdout.splitlines()[0]
    assert re.search(r"(?m)^spent\s+\$1\.80$", table.stdout)
    assert re.search(r"(?m)^savings\s+\$0\.53 \(23%\)$", table.stdout)  # of the $2.33 on-demand would cost
    assert "STEPS KEPT" in table.stdout and len(re.findall(r"(?m)^\d+\s+0\s", table.stdout)) >= 1
    as_json = json.loads(cli("cost", str(job.pk), "--json").stdout)
    assert [i["steps_kept"] for i in as_json["instances"]] == [900, 600]


def test_the_cli_never_imports_django():
    code = "import sys, respawn.cli.__main__, respawn.cli.commands; print('django' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert result.stdout.strip() == "False", result.stderr


def test_help_shows_examples_and_exit_codes():
    result = subprocess.run([str(RESPAWN), "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    assert "respawn submit job.yaml" in result.stdout and "exit codes" in result.stdout
    sub = subprocess.run([str(RESPAWN), "logs", "--help"], capture_output=True, text=True)
    assert sub.returncode == 0 and "--follow" in sub.stdout and "respawn logs 42 --follow" in sub.stdout


def test_ls_names_the_team_and_a_pipe_cut_short_ends_quietly(cli):
    user = cli.setup.people["member"].user
    Job.objects.bulk_create([Job(team=cli.setup.team, owner=user, name=f"sweep-{i:04d}", command=["python", "t.py"],
                                 total_steps=10, checkpoint_uri="/tmp/ckpt") for i in range(900)])
    table = cli("ls", "--limit", "5")
    assert table.returncode == 0, table.stderr
    assert {line.split()[2] for line in table.stdout.splitlines()[1:6]} == {cli.setup.team.name}  # not its id
    # More than a pipe holds (64 KiB), so the writer meets the reader gone.
    cut = subprocess.run(f"'{RESPAWN}' ls --limit 1000 | head -n 2", shell=True, capture_output=True, text=True,
                         env={**cli.base_env, "RESPAWN_URL": cli.url, "RESPAWN_TOKEN": cli.setup.people["member"].token},
                         timeout=120)
    assert len(cut.stdout.splitlines()) == 2 and cut.stderr == "", cut.stderr
