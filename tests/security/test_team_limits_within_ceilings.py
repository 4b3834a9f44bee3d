"""A team admin works within the ceilings deployment staff set: they cannot raise
their team's GPU allowance or budget above them, lift a limit, go past the
deployment's GPU cap, or set the ceilings themselves; staff can. The API and the
dashboard refuse alike, with a 400 naming the field."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import Client

from respawn_server.jobs.core.choices import Role
from respawn_server.jobs.models import Team
from tests.api.clients import client_for
from tests.factories import make_team_with_members


@pytest.fixture
def setup(db):
    """vision: budget 1000, 8 GPUs; staff set ceilings of 2000 USD and 12 GPUs."""
    setup = make_team_with_members()
    Team.objects.filter(pk=setup.team.pk).update(budget_ceiling_usd=2000, gpu_ceiling=12)
    return setup


def limits(setup):
    team = Team.objects.get(pk=setup.team.pk)
    return team.monthly_budget_usd, team.max_concurrent_gpus


def patch(person, setup, body):
    return client_for(person).patch(f"/api/v1/teams/{setup.team.pk}/limits/", body, format="json")


@pytest.mark.parametrize("body,field", [
    ({"max_concurrent_gpus": 13}, "max_concurrent_gpus"),
    ({"max_concurrent_gpus": None}, "max_concurrent_gpus"),  # lifting: no limit at all
    ({"monthly_budget_usd": "2000.01"}, "monthly_budget_usd"),
    ({"monthly_budget_usd": None}, "monthly_budget_usd"),
    ({"gpu_ceiling": 1000}, "gpu_ceiling"),
    ({"budget_ceiling_usd": "1000000"}, "budget_ceiling_usd"),
])
def test_a_team_admin_cannot_go_above_the_ceilings_nor_set_them(setup, body, field):
    refused = patch(setup.people[Role.ADMIN], setup, body)
    assert refused.status_code == 400
    assert list(refused.json()["errors"]) == [field]
    assert limits(setup) == (Decimal("1000"), 8)
    team = Team.objects.get(pk=setup.team.pk)
    assert (team.budget_ceiling_usd, team.gpu_ceiling) == (Decimal("2000"), 12)


def test_a_team_admin_moves_freely_under_the_ceilings(setup):
    admin = setup.people[Role.ADMIN]
    assert patch(admin, setup, {"max_concurrent_gpus": 12, "monthly_budget_usd": "2000"}).status_code == 200
    assert patch(admin, setup, {"max_concurrent_gpus": 2}).status_code == 200
    assert limits(setup) == (Decimal("2000"), 2)


def test_without_a_ceiling_a_team_admin_may_only_tighten(setup):
    Team.objects.filter(pk=setup.team.pk).update(budget_ceiling_usd=None, gpu_ceiling=None)
    admin = setup.people[Role.ADMIN]
    assert patch(admin, setup, {"max_concurrent_gpus": 9}).status_code == 400
    assert patch(admin, setup, {"monthly_budget_usd": "1000.01"}).status_code == 400
    assert patch(admin, setup, {"max_concurrent_gpus": 6, "monthly_budget_usd": "900"}).status_code == 200
    assert limits(setup) == (Decimal("900"), 6)


def test_no_team_admin_takes_every_gpu_of_the_deployment(setup, settings):
    settings.RESPAWN = {**settings.RESPAWN, "MAX_CONCURRENT_GPUS": 10}
    refused = patch(setup.people[Role.ADMIN], setup, {"max_concurrent_gpus": 11})
    assert refused.status_code == 400 and "at most 10" in refused.json()["errors"]["max_concurrent_gpus"][0]
    assert limits(setup) == (Decimal("1000"), 8)


def test_staff_set_any_limit(setup):
    admin = setup.people[Role.ADMIN]
    admin.user.is_staff = True
    admin.user.save()
    assert patch(admin, setup, {"max_concurrent_gpus": 64, "monthly_budget_usd": None}).status_code == 200
    assert limits(setup) == (None, 64)


def test_the_dashboard_refuses_the_same_naming_the_field(setup):
    page = Client()
    page.force_login(setup.people[Role.ADMIN].user)
    refused = page.post(f"/teams/{setup.team.pk}/settings/limits/", {"monthly_budget_usd": "1000",
                                                                    "max_concurrent_gpus": "500"})
    assert refused.status_code == 400
    assert "max_concurrent_gpus: at most 12 for a team admin" in refused.content.decode()
    assert limits(setup) == (Decimal("1000"), 8)
