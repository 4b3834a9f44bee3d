"""The dashboard keeps settled money (per job, and a team's settled month) so polls
do not price whole histories: what it shows must still be the ledger's figure after
every change a figure depends on."""

import datetime as dt
from decimal import Decimal

from django.test import Client

from respawn_server.frontend.selectors import LOSS_POINTS
from respawn_server.jobs.api.costs import job_cost_data, team_month_data
from respawn_server.jobs.core.choices import InstanceState
from respawn_server.jobs.models import DiskPriceQuote, Instance, Job, MetricPoint, PriceQuote
from respawn_server.jobs.money import costs
from tests.api.clients import client_for
from tests.costs.history import T, checkpoint, heartbeats, launched, make_history
from tests.factories import make_job, make_team_with_members

MONEY = ("spent", "on_demand_baseline", "savings", "waste", "gpu_hours", "jobs", "budget")


def signed_in(person):
    client = Client()
    client.force_login(person.user)
    return client


def overview(client, team):
    return client.get(f"/teams/{team.pk}/status.json?month=2026-03").json()


def api_month(person, team):
    return client_for(person).get(f"/api/v1/teams/{team.pk}/cost/?month=2026-03").json()


def test_the_overviews_month_is_the_ledgers_as_instances_start_end_and_report_late(db):
    setup = make_team_with_members()
    setup.team.refresh_from_db()  # its budget as the database keeps it, "1000.00"
    member = setup.people["member"]
    job, a, b, _ = make_history(setup.team, member.user)
    client = signed_in(setup.people["viewer"])

    def shown():
        data = overview(client, setup.team)
        return {key: data["money"][key] for key in MONEY}, data

    def ledger(now=None):
        """The API's month, or with `now` a fresh ledger at that moment (a live instance accrues)."""
        answer = api_month(member, setup.team) if now is None else \
            team_month_data(costs.team_month_cost(setup.team, "2026-03", now))
        return {key: answer[key] for key in MONEY}

    assert shown()[0] == ledger()
    assert shown()[0] == ledger(), "asked again: the stored settled part"

    # A second job starts in March and is still running: priced at the moment of each poll.
    second = make_job(setup.team, member.user, name="second", accelerator_count=2)
    running = launched(second, at=T(3, 20, 10), last_step=40)
    heartbeats(running, [(T(3, 20, 10, 1), 0), (T(3, 20, 10, 21), 40)])
    figures, data = shown()
    assert figures == ledger(dt.datetime.fromisoformat(data["as_of"]))
    assert data["live_instances"] == 1 and figures["jobs"] == 2

    # It ends: its money is settled and joins the stored part.
    Instance.objects.filter(pk=running.pk).update(state=InstanceState.ENDED, ended_at=T(3, 20, 12),
                                                  end_reason="completed")
    before = shown()[0]
    assert before == ledger()

    # A fenced instance reports a checkpoint late (its stall is waste), a quote is backfilled,
    # and an instance starts and ends between two polls: each moves the month.
    for change in (lambda: checkpoint(b, 1400, at=T(3, 1, 2, 59), stall_s=36.0),
                   lambda: PriceQuote.objects.create(provider="aws", region="hand-1", zone="hand-1a",
                                                     instance_type="hand.gpu1", market="spot",
                                                     usd_per_hour=Decimal("0.5"), observed_at=T(3, 20, 11)),
                   lambda: launched(second, at=T(3, 21, 1), ended=T(3, 21, 2), end_reason="completed")):
        change()
        after = shown()[0]
        assert after == ledger() and after != before
        before = after


def test_a_job_priced_live_and_then_settled_shows_the_apis_figure(db):
    setup = make_team_with_members()
    member = setup.people["member"]
    job, a, b, _ = make_history(setup.team, member.user)
    client = signed_in(member)
    running = launched(job, at=T(3, 5, 1), last_step=1600)
    heartbeats(running, [(T(3, 5, 1, 1), 1500), (T(3, 5, 1, 11), 1600)])
    row = client.get("/jobs.json").json()["rows"][0]
    assert row["spent"] is not None and row["cost_error"] is None
    Instance.objects.filter(pk=running.pk).update(state=InstanceState.ENDED, ended_at=T(3, 5, 2),
                                                  end_reason="completed")
    api = client_for(member)
    figures = api.get(f"/api/v1/jobs/{job.pk}/cost/").json()
    for _ in range(2):  # priced, then from the store
        row = client.get("/jobs.json").json()["rows"][0]
        status = client.get(f"/jobs/{job.pk}/status.json").json()
        assert (row["spent"], row["savings"]) == (figures["spent"], figures["savings"])
        assert status["money"]["detail"]["waste"] == figures["waste"]
        assert status["money"]["detail"]["instances"] == figures["instances"]


def test_a_stopped_disk_bills_live_until_released_and_the_stored_figure_follows(db):
    setup = make_team_with_members()
    member = setup.people["member"]
    job, a, b, _ = make_history(setup.team, member.user)
    DiskPriceQuote.objects.create(provider="aws", region="hand-1", sku="P10 LRS", usd_per_month=Decimal("73"),
                                  observed_at=T(1, 1))  # 0.10 $/h
    Instance.objects.filter(pk=a.pk).update(stopped_disk_sku="P10 LRS")  # a was evicted and its VM kept its disk
    client, viewer = signed_in(member), signed_in(setup.people["viewer"])
    api = client_for(member)

    for _ in range(2):  # not released: billed up to each poll's now, never stored
        status = client.get(f"/jobs/{job.pk}/status.json").json()
        as_of = dt.datetime.fromisoformat(status["money"]["detail"]["as_of"])
        assert status["money"]["detail"]["waste"] == job_cost_data(costs.job_cost(job, as_of))["waste"]
        billed = int(as_of.timestamp()) - int(T(3, 1, 1).timestamp())  # from a's end to the poll's now
        assert status["money"]["detail"]["waste"]["stopped_disk"] == f"{Decimal('0.10') * billed / 3600:.8f}"
    month = overview(viewer, setup.team)
    assert month["money"]["spent"] == team_month_data(costs.team_month_cost(
        setup.team, "2026-03", dt.datetime.fromisoformat(month["money"]["as_of"])))["spent"]

    Instance.objects.filter(pk=a.pk).update(storage_released_at=T(3, 1, 4))  # seen deleted three hours on
    figures = api.get(f"/api/v1/jobs/{job.pk}/cost/").json()
    assert figures["waste"]["stopped_disk"] == "0.30000000" and figures["spent"] == "2.10000000"
    assert figures["instances"][0]["stopped_disk"] == {
        "sku": "P10 LRS", "billed_from": T(3, 1, 1).isoformat(), "billed_to": T(3, 1, 4).isoformat(),
        "billed_seconds": 3 * 3600, "spent": "0.30000000"}
    for _ in range(2):  # priced, then from the store
        status = client.get(f"/jobs/{job.pk}/status.json").json()
        assert status["money"]["detail"]["waste"] == figures["waste"]
        assert status["money"]["spent"] == figures["spent"]
        assert "stopped disk $0.30" in status["money"]["waste_parts_display"]
        assert client.get("/jobs.json").json()["rows"][0]["spent"] == figures["spent"]
        shown = overview(viewer, setup.team)["money"]
        assert {key: shown[key] for key in MONEY} == {key: value for key, value in api_month(member, setup.team).items()
                                                      if key in MONEY}
    assert "stopped disk $0.30" in client.get(f"/jobs/{job.pk}/").content.decode()


def test_a_long_list_is_counted_only_past_the_page_shown(db):
    setup = make_team_with_members()
    owner = setup.people["member"].user
    Job.objects.bulk_create([Job(team=setup.team, owner=owner, name=f"job-{i:04d}", command=["true"])
                             for i in range(1030)])
    client = signed_in(setup.people["viewer"])
    page = client.get("/").content.decode()
    assert "Page 1 of 41+ (1025+ jobs)" in page and 'rel="next"' in page
    listed = client.get("/jobs.json").json()
    assert (listed["count"], listed["count_capped"], len(listed["rows"])) == (1025, True, 25)
    deep = client.get("/jobs.json?page=41").json()
    assert (deep["count"], deep["count_capped"], deep["rows"][-1]["name"]) == (1030, False, "job-0005")


def test_search_takes_wildcards_literally(db):
    setup = make_team_with_members()
    owner = setup.people["member"].user
    for name in ("a_b", "axb", "100%", "1000"):
        make_job(setup.team, owner, name=name)
    client = signed_in(setup.people["viewer"])
    assert [r["name"] for r in client.get("/jobs.json?q=_").json()["rows"]] == ["a_b"]
    assert [r["name"] for r in client.get("/jobs.json?q=0%25").json()["rows"]] == ["100%"]
    assert [r["name"] for r in client.get("/jobs.json?q=A_B").json()["rows"]] == ["a_b"]


def test_the_loss_curve_keeps_every_nth_point_of_a_long_run(db):
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user)
    short = launched(job, at=T(3, 1), ended=T(3, 2), end_reason="completed")
    start = T(3, 1, 0, 1)
    many = 2 * LOSS_POINTS
    MetricPoint.objects.bulk_create([MetricPoint(job=job, instance=short, time=start + dt.timedelta(seconds=i),
                                                 step=i, loss=1.0 / (i + 1)) for i in range(many)])
    client = signed_in(setup.people["viewer"])
    loss = client.get(f"/jobs/{job.pk}/status.json").json()["loss"]
    assert [step for step, _, _ in loss] == list(range(1, many, 2))  # twice the most: every 2nd, in step order
    MetricPoint.objects.filter(job=job, step__gte=many - 300).delete()
    assert len(client.get(f"/jobs/{job.pk}/status.json").json()["loss"]) == many - 300  # under twice: all of them
