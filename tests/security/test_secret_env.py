"""A job's secret env values (issue 17 item 5, DESIGN §11): stored encrypted, read back
by nobody (names only, every value null), given only in the register answer to one of
the job's live instances; a fenced or ended instance, or another job's, never gets them."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.db import connection
from django.test import Client
from rest_framework.test import APIClient

from respawn_server.jobs.core import secret_env
from respawn_server.jobs.core.choices import InstanceState, Role
from respawn_server.jobs.models import AuditEvent, Instance, Job
from tests.agent_api.helpers import AgentClient
from tests.factories import make_instance

SECRET = "hf_s3cr3t-value-0123456789"


def submit(person, team, **fields):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {person.token}")
    body = {"team": team.pk, "name": "llm", "command": ["python", "train.py"], **fields}
    return client.post("/api/v1/jobs/", body, format="json")


@pytest.fixture
def job(team_setup) -> Job:
    response = submit(team_setup.people[Role.MEMBER], team_setup.team, env={"BATCH": "8"},
                      secret_env={"HF_TOKEN": SECRET})
    assert response.status_code == 201, response.content
    assert response.json()["secret_env"] == {"HF_TOKEN": None}  # not even the submit's own answer echoes it
    return Job.objects.get(pk=response.json()["id"])


@pytest.mark.parametrize("role", [Role.MEMBER, Role.ADMIN, Role.VIEWER])
def test_nobody_reads_a_secret_value_back_only_its_name(team_setup, job, role):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {team_setup.people[role].token}")
    detail, listed = client.get(f"/api/v1/jobs/{job.pk}/"), client.get("/api/v1/jobs/")
    (row,) = [row for row in listed.json()["results"] if row["id"] == job.pk]
    assert detail.json()["secret_env"] == row["secret_env"] == {"HF_TOKEN": None}
    assert SECRET not in detail.content.decode() + listed.content.decode()


def test_the_dashboards_form_takes_secrets_and_never_sends_one_back(team_setup):
    browser = Client()
    browser.force_login(team_setup.people[Role.MEMBER].user)
    form = {"name": "llm", "command": "python train.py", "priority": "0",
            "secret_env": f"HF_TOKEN={SECRET}\nWANDB_API_KEY=w={SECRET}\n"}
    refused = browser.post(f"/teams/{team_setup.team.pk}/submit/", {**form, "total_steps": "0"})
    assert refused.status_code == 400 and SECRET.encode() not in refused.content  # not even to correct it
    accepted = browser.post(f"/teams/{team_setup.team.pk}/submit/", form)
    assert accepted.status_code == 302, accepted.content
    job = Job.objects.get()
    assert secret_env.unseal(job.secret_env) == {"HF_TOKEN": SECRET, "WANDB_API_KEY": f"w={SECRET}"}
    for path in (accepted["Location"], f"/jobs/{job.pk}/status.json", "/", f"/teams/{team_setup.team.pk}/"):
        assert SECRET.encode() not in browser.get(path).content, path


def test_the_database_holds_the_value_only_encrypted(job):
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM jobs_job WHERE id = %s", [job.pk])
        row = " ".join(map(str, cursor.fetchone()))
    assert "HF_TOKEN" in row and SECRET not in row
    assert secret_env.unseal(job.secret_env) == {"HF_TOKEN": SECRET}
    assert not any(SECRET in str(event.details) for event in AuditEvent.objects.all())


def test_only_a_live_instance_of_the_job_gets_the_value_in_its_register_answer(team_setup, job):
    vm = make_instance(job)
    answer = AgentClient().register(vm.bootstrap_token)
    assert answer.status_code == 200
    assert answer.json()["job"]["secret_env"] == {"HF_TOKEN": SECRET}
    assert answer.json()["job"]["env"] == {"BATCH": "8"}  # kept apart: the agent never logs secret_env

    other = submit(team_setup.people[Role.MEMBER], team_setup.team)
    other_vm = make_instance(Job.objects.get(pk=other.json()["id"]))
    other_answer = AgentClient().register(other_vm.bootstrap_token)
    assert other_answer.status_code == 200 and other_answer.json()["job"]["secret_env"] == {}
    assert SECRET not in other_answer.content.decode()

    for state in (InstanceState.ENDED, InstanceState.PREEMPTING):
        fenced = make_instance(job, rank=1, state=state)
        refused = AgentClient().register(fenced.bootstrap_token)
        assert refused.status_code == 401 and SECRET not in refused.content.decode()
    # The live VM's own resend of its register, once its instance was fenced, gets nothing either.
    Instance.objects.filter(pk=vm.instance.pk).update(state=InstanceState.ENDED)
    resend = AgentClient().register(vm.bootstrap_token, event_id=Instance.objects.get(pk=vm.instance.pk).register_event_id)
    assert resend.status_code == 401 and SECRET not in resend.content.decode()


@pytest.mark.parametrize("fields, problem", [
    ({"env": {"HF_TOKEN": "x"}, "secret_env": {"HF_TOKEN": SECRET}}, "also in env"),
    ({"secret_env": {"HF_TOKEN": 5}}, "string to string"),
    ({"secret_env": {"A=B": SECRET}}, "must not contain '='"),
    ({"secret_env": [SECRET]}, "string to string"),
])
def test_a_bad_secret_env_is_a_400_naming_it_without_the_value(team_setup, fields, problem):
    response = submit(team_setup.people[Role.MEMBER], team_setup.team, **fields)
    assert response.status_code == 400 and problem in str(response.json()["errors"]["secret_env"]), response.content
    assert SECRET not in response.content.decode()
    assert not Job.objects.exists()


def test_a_rotated_key_still_opens_old_values_and_a_lost_key_fails_the_register_naming_the_secret(
        team_setup, job, settings):
    old_key = settings.RESPAWN["SECRETS_KEY"] or open(settings.RESPAWN["SECRETS_KEY_FILE"]).read().strip()
    new_key = Fernet.generate_key().decode()
    settings.RESPAWN = {**settings.RESPAWN, "SECRETS_KEY": f"{new_key},{old_key}"}
    call_command("rotate_secrets_key")
    settings.RESPAWN = {**settings.RESPAWN, "SECRETS_KEY": new_key}  # the old key retired
    job.refresh_from_db()
    assert secret_env.unseal(job.secret_env) == {"HF_TOKEN": SECRET}

    settings.RESPAWN = {**settings.RESPAWN, "SECRETS_KEY": Fernet.generate_key().decode()}  # lost
    answer = AgentClient().register(make_instance(job).bootstrap_token)
    assert answer.status_code == 500 and SECRET not in answer.content.decode()
    assert "SecretsKeyError" in answer.json()["detail"]
    with pytest.raises(secret_env.SecretsKeyError, match="HF_TOKEN"):
        secret_env.unseal(job.secret_env)


def test_the_key_file_is_made_once_owner_only(settings, tmp_path):
    settings.RESPAWN = {**settings.RESPAWN, "SECRETS_KEY": "", "SECRETS_KEY_FILE": str(tmp_path / "secrets.key")}
    sealed = secret_env.seal({"A": "1"})
    assert (tmp_path / "secrets.key").stat().st_mode & 0o777 == 0o600
    assert secret_env.unseal(sealed) == {"A": "1"}


def test_the_admin_site_neither_shows_nor_writes_a_jobs_secret_env(job, admin_client):
    page = admin_client.get(f"/admin/jobs/job/{job.pk}/change/")
    assert page.status_code == 200 and b"secret_env" not in page.content
    assert job.secret_env["HF_TOKEN"].encode() not in page.content
