"""A job spec that could never run is refused at submit with a 400 naming the field,
by the API, the dashboard's form and the CLI's job-file check alike: text execve
cannot carry, clouds this deployment has not enabled, regions and instance types
its price book does not know, more accelerators than any VM or allowance holds.
Accepted, such a job failed on its VM (or in PostgreSQL) or waited in the queue
for ever with a reason that misled."""

from __future__ import annotations

import pytest
from django.test import Client

from respawn_server.jobs.models import Job
from respawn.cli.jobspec import InvalidSpec, load_job_spec
from tests.api.clients import client_for

GOOD = {"name": "refused", "command": ["python", "train.py"]}


@pytest.fixture
def clouds(settings):
    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": ["aws", "gcp", "local"], "MAX_CONCURRENT_GPUS": None}
    return settings


def submit(team_setup, **fields):
    client = client_for(team_setup.people["member"])
    client.raise_request_exception = False
    return client.post("/api/v1/jobs/", {"team": team_setup.team.pk, **GOOD, **fields}, format="json")


def refused(answer, field: str) -> str:
    assert answer.status_code == 400, answer.content
    body = answer.json()
    assert list(body["errors"]) == [field], body
    assert not Job.objects.filter(name="refused").exists()
    return " ".join(body["errors"][field])


@pytest.mark.parametrize("fields, field, says", [
    ({"command": ["python", "train\x00.py"]}, "command", "NUL"),
    ({"post_command": ["python", "\x00"]}, "post_command", "NUL"),
    ({"env": {"TOKEN": "a\x00b"}}, "env", "NUL"),
    ({"env": {"TO\x00KEN": "ab"}}, "env", "NUL"),
    ({"env": {"A=B": "1"}}, "env", "'='"),
    ({"env": {"": "1"}}, "env", "empty"),
    # Respawn's own settings: a value the agent would ignore on the VM
    ({"env": {"RESPAWN_MEMORY_TIER": "yes"}}, "env", "RESPAWN_MEMORY_TIER must be on or off, not 'yes'"),
    ({"env": {"RESPAWN_REPLICA_EVERY_STEPS": "0"}}, "env", "RESPAWN_REPLICA_EVERY_STEPS must be a whole number"),
    ({"instance_types": ["g5.xlarge\x00"]}, "instance_types", "NUL"),
])
def test_text_execve_cannot_carry_is_refused(team_setup, clouds, fields, field, says):
    assert says in refused(submit(team_setup, **fields), field)


def test_a_cloud_this_deployment_has_not_enabled_is_refused(team_setup, clouds):
    clouds.RESPAWN = {**clouds.RESPAWN, "PROVIDERS": ["local"]}
    assert "enabled: ['local']" in refused(submit(team_setup, allowed_clouds=["aws", "local"]), "allowed_clouds")


@pytest.mark.parametrize("fields, field, says", [
    ({"allowed_regions": ["mars-1"]}, "allowed_regions", "mars-1: not in the price book of aws, gcp, local"),
    ({"instance_types": ["g5.xlarg"]}, "instance_types", "did you mean 'g5.xlarge'?"),
    # Priced, but only on a cloud the job does not allow.
    ({"allowed_clouds": ["gcp"], "instance_types": ["g5.xlarge"]}, "instance_types", "price book of gcp"),
    ({"allowed_regions": ["us-east-1"], "instance_types": ["a2-highgpu-1g"]}, "instance_types",
     "none of a2-highgpu-1g is priced in us-east-1"),
])
def test_a_region_or_instance_type_the_price_book_does_not_know_is_refused(team_setup, clouds, fields, field, says):
    assert says in refused(submit(team_setup, **fields), field)


def test_more_accelerators_per_node_than_any_instance_type_has_is_refused(team_setup, clouds):
    assert "at most 8 per node" in refused(submit(team_setup, accelerator_count=10**9), "accelerator_count")


def test_more_accelerators_than_a_gpu_allowance_is_refused(team_setup, clouds):
    team_setup.team.max_concurrent_gpus = 8
    team_setup.team.save()
    says = refused(submit(team_setup, nodes=2, accelerator_count=8), "accelerator_count")
    assert f"team {team_setup.team.name}'s limit of 8" in says
    team_setup.team.max_concurrent_gpus = None
    team_setup.team.save()
    clouds.RESPAWN = {**clouds.RESPAWN, "MAX_CONCURRENT_GPUS": 12}
    assert "this deployment's limit of 12" in refused(submit(team_setup, nodes=2, accelerator_count=8),
                                                       "accelerator_count")


def test_a_spec_every_check_allows_is_accepted(team_setup, clouds):
    answer = submit(team_setup, allowed_clouds=["aws"], allowed_regions=["us-east-1"], instance_types=["g5.12xlarge"],
                    nodes=2, accelerator_count=4, env={"HF_HOME": "/data/hf", "EMPTY": "", "RESPAWN_MEMORY_TIER": "on",
                                                       "RESPAWN_REPLICA_EVERY_STEPS": "20"})
    assert answer.status_code == 201, answer.content


def test_the_dashboard_form_shows_the_same_refusal(team_setup, clouds):
    browser = Client(raise_request_exception=False)
    browser.force_login(team_setup.people["member"].user)
    page = browser.post(f"/teams/{team_setup.team.pk}/submit/", {**GOOD, "command": "python train.py",
                                                                  "priority": 0, "instance_types": "g5.xlarg"})
    assert page.status_code == 400
    assert "did you mean &#x27;g5.xlarge&#x27;?" in page.content.decode()
    assert not Job.objects.filter(name="refused").exists()


@pytest.mark.parametrize("line, says", [
    ('env: {"A=B": "1"}', "must not contain '='"),
    ('env: {"": "1"}', "must not be empty"),
    ('env: {RESPAWN_MEMORY_TIER: "true"}', "must be on or off"),
    ('env: {TOKEN: "a\\0b"}', "NUL"),
    ('post_command: ["python", "a\\0b"]', "NUL"),
])
def test_the_cli_refuses_the_same_before_sending(tmp_path, line, says):
    path = tmp_path / "job.yaml"
    path.write_text(f"team: vision\nname: refused\ncommand: python train.py\n{line}\n")
    with pytest.raises(InvalidSpec) as refusal:
        load_job_spec(path)
    assert any(says in problem and ":4:" in problem for problem in refusal.value.problems), refusal.value.problems
