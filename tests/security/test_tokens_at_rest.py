"""Tokens are stored only as digests: after every way a token is made (login,
token creation, agent registration, a dashboard session) no column of any table
holds one, while the tokens themselves work."""

from __future__ import annotations

from django.test import Client
from rest_framework.test import APIClient

from respawn import protocol
from respawn_server.jobs.core.choices import InstanceState
from respawn_server.jobs.fleet.instances import bootstrap_token_for
from respawn_server.jobs.people.tokens import hash_token
from tests.agent_api.helpers import AgentClient
from tests.api.clients import client_for
from tests.factories import make_instance, make_job
from tests.security.leaks import tokens_in, tokens_in_database


def test_no_plaintext_token_in_any_column_after_login_creation_and_registration(team_setup):
    admin = team_setup.people["admin"]
    login = APIClient().post("/api/v1/auth/token/", {"username": admin.user.username,
                                                     "password": "correct horse battery", "token_name": "cli"},
                             format="json")
    created = client_for(admin).post("/api/v1/tokens/", {"name": "ci"}, format="json")
    job = make_job(team_setup.team, admin.user)
    setup = make_instance(job)
    agent = AgentClient()
    registered = agent.register(setup.bootstrap_token)
    assert agent.post(protocol.PATH_HEARTBEAT, protocol.Heartbeat(step=1)).status_code == 200
    # A launched instance's bootstrap token is derived, never stored; its digest is.
    launched = make_instance(job, rank=1, state=InstanceState.REQUESTED)
    launched.instance.bootstrap_token_hash = hash_token(bootstrap_token_for(launched.instance))
    launched.instance.save(update_fields=["bootstrap_token_hash"])
    Client().post("/login/", {"username": admin.user.username, "password": "correct horse battery"})

    issued = [login.json()["token"], created.json()["token"], registered.json()["agent_token"],
              setup.bootstrap_token, bootstrap_token_for(launched.instance), admin.token]
    assert all(tokens_in(t) == [t] for t in issued)  # the scan below would see each one
    assert tokens_in_database() == []
    # ... and the tokens still open what they should.
    assert client_for(type(admin)(admin.user, login.json()["token"])).get("/api/v1/jobs/").status_code == 200


def test_the_scan_finds_a_token_wherever_it_is_written(team_setup):
    # The control for the test above: a token in a text column and in a JSON column is found.
    token = team_setup.people["viewer"].token
    job = make_job(team_setup.team, team_setup.people["admin"].user, env={"WANDB_KEY": token})
    job.failure_message = f"oops {token}"
    job.save(update_fields=["failure_message"])
    found = {(table, column) for table, column, t in tokens_in_database() if t == token}
    assert found == {("jobs_job", "env"), ("jobs_job", "failure_message")}
