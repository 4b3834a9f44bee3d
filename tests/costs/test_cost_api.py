"""GET /api/v1/jobs/{id}/cost/ and /api/v1/teams/{id}/cost/: figures, scoping, bad input."""

import pytest
from rest_framework.test import APIClient

from respawn_server.jobs.people.permissions import role_allows
from tests.costs.history import make_history
from tests.factories import make_team_with_members

WHO = ["viewer", "member", "admin", "outsider", "anonymous"]


@pytest.fixture
def world(db):
    setup = make_team_with_members()
    job, *_ = make_history(setup.team, setup.people["member"].user)
    return setup, job


def client_for(setup, who):
    client = APIClient()
    if who != "anonymous":
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {setup.people[who].token}")
    return client


def test_job_cost_answers_the_ledger_figures_as_exact_strings(world):
    setup, job = world
    body = client_for(setup, "viewer").get(f"/api/v1/jobs/{job.pk}/cost/").json()
    assert (body["spent"], body["on_demand_baseline"], body["savings"]) == ("1.80000000", "2.33333333", "0.53333333")
    assert body["waste"] == {"recomputed": "0.10000000", "boot_restore": "0.15000000",
                             "checkpoint_stalls": "0.00150000", "stopped_disk": "0.00000000", "total": "0.25150000"}
    assert body["by_month"]["2026-02"]["spent"] == "0.36000000"
    assert [(i["steps_kept"], i["recomputed_steps"]) for i in body["instances"]] == [(900, 0), (600, 100)]


def test_job_and_team_cost_include_a_stopped_disk_from_the_end_to_its_release(world):
    from decimal import Decimal

    from respawn_server.jobs.models import DiskPriceQuote, Instance
    from tests.costs.history import T

    setup, job = world
    DiskPriceQuote.objects.create(provider="aws", region="hand-1", sku="P10 LRS", usd_per_month=Decimal("73"),
                                  observed_at=T(1, 1))  # 0.10 $/h
    evicted = Instance.objects.filter(job=job).order_by("pk").first()  # A: preempted Mar 1 01:00
    Instance.objects.filter(pk=evicted.pk).update(stopped_disk_sku="P10 LRS", storage_released_at=T(3, 1, 4))
    client = client_for(setup, "viewer")
    body = client.get(f"/api/v1/jobs/{job.pk}/cost/").json()
    assert (body["spent"], body["savings"]) == ("2.10000000", "0.23333333")  # 1.80 + 3 h of disk at 0.10
    assert (body["waste"]["stopped_disk"], body["waste"]["total"]) == ("0.30000000", "0.55150000")
    assert body["by_month"]["2026-03"]["waste"] == "0.50575000"  # half of A's 0.0915, B's 0.16, the disk's 0.30
    assert [i["stopped_disk"] and i["stopped_disk"]["billed_seconds"] for i in body["instances"]] == [10800, None]
    team = client.get(f"/api/v1/teams/{setup.team.pk}/cost/?month=2026-03").json()
    assert (team["spent"], team["gpu_hours"]) == ("1.74000000", "2.00"), "a disk's hours are no GPU-hours"


def test_team_cost_answers_one_utc_month(world):
    setup, _ = world
    body = client_for(setup, "viewer").get(f"/api/v1/teams/{setup.team.pk}/cost/?month=2026-03").json()
    assert (body["month"], body["spent"], body["savings"], body["gpu_hours"]) == \
        ("2026-03", "1.44000000", "0.14333333", "2.00")
    assert body["budget"] == "1000.00"


def test_a_bad_month_is_a_400_naming_month(world):
    setup, _ = world
    response = client_for(setup, "viewer").get(f"/api/v1/teams/{setup.team.pk}/cost/?month=2026-3")
    assert response.status_code == 400
    assert "month" in response.json()["errors"]


@pytest.mark.parametrize("who", WHO)
@pytest.mark.parametrize("kind", ["job", "team"])
def test_cost_endpoints_follow_the_permission_table(world, who, kind):
    setup, job = world
    url = f"/api/v1/jobs/{job.pk}/cost/" if kind == "job" else f"/api/v1/teams/{setup.team.pk}/cost/"
    response = client_for(setup, who).get(url)
    if who == "anonymous":
        expected = 401
    elif who == "outsider":
        expected = 404  # another team's job or team does not exist for you
    else:
        expected = 200 if role_allows(who, f"{kind}.view") else 403
    assert response.status_code == expected, response.content


def test_a_job_that_never_ran_costs_nothing(world):
    from tests.factories import make_job

    setup, _ = world
    fresh = make_job(setup.team, setup.people["member"].user)
    body = client_for(setup, "member").get(f"/api/v1/jobs/{fresh.pk}/cost/").json()
    assert (body["spent"], body["savings"], body["instances"]) == ("0.00000000", "0.00000000", [])
