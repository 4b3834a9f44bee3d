"""schemathesis against the live server's /api/schema/: the people's API as a
team admin and the agent API with an agent token. Every answer must be no 5xx
and match the schema (status code documented, body and content type as
documented). Query parameters get, besides what their schema generates, values
a hostile client sends: numbers beyond 64 bits, digits int() refuses, calendar
edges, NUL, long text."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from decimal import Decimal

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from respawn_server.jobs.api.urls import agent_urlpatterns
from respawn_server.jobs.core.choices import InstanceState
from respawn_server.jobs.models import Checkpoint, PriceQuote
from respawn_server.jobs.people.team_admin import issue_token
from tests.agent_api.helpers import checkpoint_uri
from tests.factories import make_instance, make_job, make_team_with_members

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# A source archive's upload (PUT /api/v1/sources/{digest}/) is raw bytes, mostly not a gzip'd tar at all.
schemathesis.openapi.media_type("application/gzip", st.binary(max_size=4096))
# Per operation, a third each: as generated, aimed at objects that exist, hostile query values at
# objects that exist; ~40 operations x this stays near a minute.
EXAMPLES_PER_OPERATION = 25
HOSTILE_QUERY_VALUES = [
    "9223372036854775808", "-9223372036854775809", "1" * 40, "-1", "0", "1.5", "1e400", "NaN", "²", "١٢",
    "9999-12", "0000-01", "9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00", "9223372036854775808:0", "1:²",
    "\x00", "x" * 1000, "", ",", "%",
]


@pytest.fixture
def world(transactional_db, web_server):
    """A team with an admin, a running job with a registered agent, one checkpoint,
    one interruption, a price quote and a spare token: every path parameter of the
    schema can name something real."""
    setup = make_team_with_members()
    admin = setup.people["admin"]
    job = make_job(setup.team, admin.user)
    agent = make_instance(job, state=InstanceState.RUNNING, registered=True)
    agent_headers = {"Authorization": f"Bearer {agent.agent_token}"}
    api = web_server.url + "/api/agent/v1/"
    checkpoint_id = str(uuid.uuid4())
    for call, body in (
        ("checkpoints", {"checkpoint_id": checkpoint_id, "step": 10, "uri": checkpoint_uri(job, 10), "bytes": 1,
                         "manifest_digest": "xxh3:00"}),
        ("notice", {"source": "aws_imds", "notice_time": "2026-11-29T22:00:00Z", "raw": "{}"}),
    ):
        answer = requests.post(api + call, json={"event_id": str(uuid.uuid4()), **body}, headers=agent_headers)
        assert answer.status_code == 200, answer.text
    quote = PriceQuote.objects.create(provider="aws", region="us-east-1", zone="us-east-1a", instance_type="g5.xlarge",
                                      market="spot", usd_per_hour=Decimal("0.5"),
                                      observed_at=datetime(2026, 11, 1, tzinfo=timezone.utc))
    spare, _ = issue_token(admin.user, "spare")  # revoking this one leaves the admin signed in
    real = {
        "jobs": {"id": job.pk}, "instances": {"id": agent.instance.pk},
        "checkpoints": {"id": Checkpoint.objects.get().pk, "checkpoint_id": checkpoint_id},
        "interruptions": {"id": agent.instance.interruptions.get().pk}, "prices": {"id": quote.pk},
        "tokens": {"id": spare.pk},
        # A member, never the admin fuzzing: removing oneself would end the run early.
        "teams": {"id": setup.team.pk, "team_pk": setup.team.pk, "username": setup.people["member"].user.username},
    }
    return {"admin": {"Authorization": f"Bearer {admin.token}"}, "agent": agent_headers, "real": real,
            "base_url": web_server.url}


def real_path_parameters(path: str, real: dict) -> dict | None:
    for collection, values in real.items():
        if f"/{collection}/" in path:
            return values
    return None


def fuzz(operation, headers: dict, real: dict, base_url: str):
    generated = operation.as_strategy()
    names = {p.name for p in operation.path_parameters}
    known = real_path_parameters(operation.path, real)
    existing = {name: known[name] for name in names if name in known} if known else {}
    if existing:
        generated = st.one_of(generated, operation.as_strategy(path_parameters=existing))
    query_names = [p.name for p in operation.query]
    if query_names:
        # At most three at once: gunicorn answers a request line over 4 KiB itself (414).
        hostile = st.dictionaries(st.sampled_from(query_names), st.sampled_from(HOSTILE_QUERY_VALUES),
                                  min_size=1, max_size=3)
        generated = st.one_of(generated, hostile.flatmap(
            lambda query: operation.as_strategy(path_parameters=existing, query=query)))

    @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(generated)
    def run(case):
        case.call_and_validate(base_url=base_url, headers=headers, checks=CHECKS, timeout=30)

    run()


def operations(base_url: str, prefix: str):
    schema = schemathesis.openapi.from_url(base_url + "/api/schema/?format=json")
    found = [result.ok() for result in schema.get_all_operations()]
    return [op for op in found if op.path.startswith(prefix)]


def fuzz_all(ops, headers: dict, world: dict):
    """Every operation gets its turn; the failures of all of them are reported together."""
    failures = []
    for operation in ops:
        try:
            fuzz(operation, headers, world["real"], world["base_url"])
        # FailureGroup, a BaseExceptionGroup, is what several failed checks of one example raise.
        except (Exception, FailureGroup) as e:  # noqa: BLE001  (hypothesis' minimal failing example, to report with the others)
            failures.append(f"{operation.method.upper()} {operation.path}:\n{e}")
    assert not failures, "\n\n".join(failures)


def test_the_peoples_api_answers_every_generated_request_as_documented(world):
    ops = operations(world["base_url"], "/api/v1/")
    assert len(ops) > 30
    fuzz_all(ops, world["admin"], world)


def test_the_agent_api_answers_every_generated_request_as_documented(world):
    ops = operations(world["base_url"], "/api/agent/v1/")
    assert len(ops) == len(agent_urlpatterns)  # every agent call is in the schema, so fuzzed
    fuzz_all(ops, world["agent"], world)
