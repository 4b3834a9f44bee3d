"""The jobs list: filters by status, owner and cloud, search, pagination."""

from django.test import Client

from respawn_server.frontend.selectors import JOBS_PER_PAGE
from respawn_server.jobs.models import PriceQuote
from tests.factories import make_instance, make_job, make_team_with_members


def listed(client, query=""):
    return [row["name"] for row in client.get(f"/jobs.json{query}").json()["rows"]]


def test_filters_and_search_narrow_the_list(db):
    setup = make_team_with_members()
    member, admin = setup.people["member"].user, setup.people["admin"].user
    make_job(setup.team, member, name="resnet-a", status="running")
    on_aws = make_job(setup.team, admin, name="bert-b", status="queued")
    make_instance(on_aws, provider="aws", region="us-east-1", zone="us-east-1a", instance_type="g5.xlarge")
    make_job(setup.team, admin, name="resnet-c", status="failed")
    client = Client()
    client.force_login(setup.people["viewer"].user)
    assert listed(client) == ["resnet-c", "bert-b", "resnet-a"]  # newest first
    assert listed(client, "?status=running&status=failed") == ["resnet-c", "resnet-a"]
    assert listed(client, f"?owner={admin.username}") == ["resnet-c", "bert-b"]
    assert listed(client, "?cloud=aws") == ["bert-b"]
    assert listed(client, "?q=RESNET") == ["resnet-c", "resnet-a"]


def test_the_list_is_paginated(db):
    setup = make_team_with_members()
    for i in range(JOBS_PER_PAGE + 3):
        make_job(setup.team, setup.people["member"].user, name=f"job-{i:02d}")
    client = Client()
    client.force_login(setup.people["viewer"].user)
    first = client.get("/")
    assert b"Page 1 of 2" in first.content and b'rel="next"' in first.content
    second = client.get("/?page=2")
    assert second.content.count(b"data-job=") == 3


def test_the_prices_page_shows_the_quote_in_force(db):
    setup = make_team_with_members()
    PriceQuote.objects.create(provider="aws", region="hand-1", zone="hand-1a", instance_type="hand.gpu1", market="spot",
                              usd_per_hour="0.11111", observed_at="2026-01-01T00:00:00Z")
    PriceQuote.objects.create(provider="aws", region="hand-1", zone="hand-1a", instance_type="hand.gpu1", market="spot",
                              usd_per_hour="0.22222", observed_at="2026-02-01T00:00:00Z")
    client = Client()
    client.force_login(setup.people["outsider"].user)  # prices are open to anyone signed in
    page = client.get("/prices/?provider=aws&type=hand.gpu1").content
    assert b"0.22222" in page and b"0.11111" not in page


def test_the_filter_form_shows_what_was_asked(db):
    setup = make_team_with_members()
    client = Client()
    client.force_login(setup.people["viewer"].user)
    owner = setup.people["admin"].user.username
    page = client.get(f"/?status=running&status=failed&owner={owner}&cloud=aws&q=res%3Cnet").content.decode()
    assert 'value="running" checked' in page and 'value="failed" checked' in page
    assert 'value="queued" checked' not in page
    assert f"<option selected>{owner}</option>" in page and '<option value="aws" selected>' in page
    assert 'name="q" value="res&lt;net"' in page
