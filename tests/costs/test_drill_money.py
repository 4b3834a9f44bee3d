"""A drill's money shown apart (issue 38): the hand-computed history of tests/costs/history.py
with A's end a drill's. B, launched after it, recovers from it: its recomputed steps (A's
lost work, 0.10) and its boot/restore (0.06) are the drill's 0.16, in the bill (1.80) but
not in spent (spot's own, 1.64), savings (2.33333333 − 1.64) or waste (0.0915); A's end
counts as no interruption. Each surface: the ledger, the job's and the team's cost API,
`respawn cost`, the job page, the savings report (API, CSV, page) and `respawn report`."""

from decimal import Decimal

import pytest
from django.test import Client
from rest_framework.test import APIClient

from respawn_server.jobs.core.choices import DrillStatus, InterruptionKind
from respawn_server.jobs.models import Drill, InterruptionEvent
from respawn_server.jobs.money import costs
from respawn.cli import commands
from respawn.cli.__main__ import main
from tests.costs.history import T, make_history
from tests.drills.test_drill_report import InProcessApi
from tests.factories import make_team_with_members

D = Decimal
NOW = T(11, 29, 12)
RANGE = {"from": "2026-01", "to": "2026-12"}


@pytest.fixture
def drilled(db):
    setup = make_team_with_members()
    job, a, b, _ = make_history(setup.team, setup.people["member"].user)
    Drill.objects.create(job=job, instance=a, requested_by=setup.people["member"].user, status=DrillStatus.SENT,
                         interrupted_at=T(3, 1, 0, 55))
    InterruptionEvent.objects.create(instance=a, kind=InterruptionKind.NOTICE, source="aws_imds")
    InterruptionEvent.objects.filter(instance=a).update(received_at=T(3, 1, 0, 56))
    return setup, job, a, b


def api_as(person) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {person.token}")
    return client


def test_the_ledger_puts_the_replacements_lost_work_and_boot_on_the_drill(drilled):
    _, job, a, b = drilled
    cost = costs.job_cost(job, NOW)
    assert cost.work[b.pk].drill and not cost.work[a.pk].drill
    assert (cost.ledger.drill.lost_work, cost.ledger.drill.replacement_boot) == (D("0.10"), D("0.06"))
    assert cost.ledger.spent == D("1.80") and cost.ledger.spot_spent == D("1.64")  # the bill holds it; spot's not
    assert cost.ledger.savings == D("2.33333333") - D("1.64")
    assert (cost.ledger.waste.recomputed, cost.ledger.waste.boot_restore, cost.ledger.waste.total) == (
        D(0), D("0.09"), D("0.0915"))
    assert cost.ledger.by_month["2026-03"].drill == D("0.16") and cost.ledger.by_month["2026-02"].drill == 0


def test_a_drill_refused_moves_no_money(drilled):
    _, job, *_ = drilled
    Drill.objects.update(status=DrillStatus.REFUSED)
    cost = costs.job_cost(job, NOW)
    assert cost.ledger.drill.total == 0 and cost.ledger.savings == D("0.53333333")


def test_the_job_and_team_cost_api_give_the_drill_apart(drilled):
    setup, job, *_ = drilled
    api = api_as(setup.people["viewer"])
    body = api.get(f"/api/v1/jobs/{job.pk}/cost/").json()
    assert (body["spent"], body["savings"], body["billed"]) == ("1.64000000", "0.69333333", "1.80000000")
    assert body["drills"] == {"lost_work": "0.10000000", "replacement_boot": "0.06000000", "total": "0.16000000"}
    assert body["waste"]["total"] == "0.09150000"
    assert [i["drills"] for i in body["instances"]] == ["0.00000000", "0.16000000"]
    team = api.get(f"/api/v1/teams/{setup.team.pk}/cost/?month=2026-03").json()
    assert (team["spent"], team["drills"], team["billed"]) == ("1.28000000", "0.16000000", "1.44000000")
    assert team["savings"] == "0.30333333"  # 1.58333333 on-demand − 1.28 spot: the drill is no saving lost


def test_respawn_cost_prints_the_drill_apart(drilled, monkeypatch, capsys):
    setup, job, *_ = drilled
    monkeypatch.setattr(commands, "api", lambda args: InProcessApi(setup.people["viewer"]))
    assert main(["cost", str(job.pk)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # fields are padded to a column
    assert "spent on drills $0.16 (lost work $0.10, replacement boot $0.06; not in spent or savings)" in out
    assert "billed in all $1.80" in out and "spent $1.64 " in out


def test_the_job_page_shows_what_drills_spent_apart(drilled):
    setup, job, *_ = drilled
    browser = Client()
    browser.force_login(setup.people["viewer"].user)
    page = browser.get(f"/jobs/{job.pk}/").content.decode()
    drills = page[page.index('id="job-drills"'):]
    assert not drills.startswith('id="job-drills" hidden')
    assert 'data-exact="0.16000000">$0.16</dd>' in drills
    assert "lost work $0.10 · replacement boot $0.06 (not in spent or savings)" in drills
    assert 'data-field="spent" data-exact="1.64000000"' in page


def test_the_savings_report_gives_the_drill_apart_and_counts_no_interruption(drilled, monkeypatch, capsys):
    setup, job, a, _ = drilled
    api = api_as(setup.people["viewer"])
    body = api.get(f"/api/v1/teams/{setup.team.pk}/report/", RANGE).json()
    assert body["totals"]["drills"]["total"] == "0.16000000" and body["totals"]["spent"] == "1.64000000"
    assert body["totals"]["savings"] == "0.69333333" and body["totals"]["billed"] == "1.80000000"
    [row] = body["jobs"]
    assert (row["drills"], row["spent"], row["preemptions"]) == ("0.16000000", "1.64000000", 0)
    march = next(m for m in body["months"] if m["month"] == "2026-03")
    assert (march["drills"], march["savings"]) == ("0.16000000", "0.30333333")
    # A's end and its notice were the drill's: no interruption of its zone (C's capacity error is none either).
    assert body["interruptions"] == []
    csv_rows = api.get(f"/api/v1/teams/{setup.team.pk}/report/", {**RANGE, "format": "csv", "table": "jobs"}
                       ).content.decode().splitlines()
    header, line = csv_rows[0].split(","), csv_rows[1].split(",")
    assert dict(zip(header, line))["drills"] == "0.16000000"
    browser = Client()
    browser.force_login(setup.people["viewer"].user)
    page = browser.get(f"/teams/{setup.team.pk}/report/", RANGE).content.decode()
    assert 'data-field="drills" data-exact="0.16000000">$0.16</dd>' in page
    monkeypatch.setattr(commands, "api", lambda args: InProcessApi(setup.people["viewer"]))
    assert main(["report", "--from", "2026-01", "--to", "2026-12"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "spent on drills $0.16 (lost work $0.10" in out and "billed in all $1.80" in out


def test_a_real_preemption_beside_a_drill_is_still_counted(drilled):
    setup, job, a, b = drilled
    from respawn_server.jobs.models import Instance

    Instance.objects.filter(pk=b.pk).update(end_reason="preempted")
    zones = costs.interruptions_between(setup.team, T(1, 1), T(12, 1))
    assert [(r["kind_name"], r["count"]) for r in zones] == [("preempted", 1)]
