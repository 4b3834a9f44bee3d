"""Every figure a user reads of a recorded real run agrees with the others (issue 34, item 4).

The run is tests/costs/data/local_run.json (record_local_run.py: the whole system on
the local provider, the example trainer on cpu-small spot VMs that the market reclaimed
with a notice four times before the job finished), moved to have ended minutes ago so
that placement's estimates, which weigh the last 30 days, still count it. Its figures
are read where a user reads them: the job page and its JSON, the jobs list, the team
overview, the savings report page, the API, and `respawn show`, `cost` and `report`.

- spent + saved = on-demand to the last digit shown, wherever the three are shown, and
  a figure shown in several places is the same text in each;
- the interruptions counter counts the VMs the cloud interrupted, the same everywhere;
- each interruption rate's point estimate lies inside its own 90 % interval;
- hours are named by the hardware: no GPU-hours for CPU VMs."""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal

from django.test import Client
from django.utils import timezone

from respawn.vocabulary.money import money_figures
from tests.api.clients import client_for
from tests.cli.test_cli_live import cli  # noqa: F401  (the fixture: the console script against a live server)
from tests.costs import recorded

CLOUD_CAUSED = ("notice", "preempted")  # a drill or a cancel is no interruption by the cloud
DOLLARS = r"-?\$[\d,.]+(?: \([^)]*\))?"  # '$0.0046', '$0.0058 (56%)'


def amount(text: str) -> Decimal:
    return Decimal(text.split(" ")[0].replace("$", "").replace(",", ""))


def recent_run() -> dict:
    """The recording, ended ten minutes ago, within one month."""
    run = recorded.read()
    end = timezone.now() - dt.timedelta(minutes=10)
    start = end - (recorded.at(run["instances"][-1]["ended_at"]) - recorded.at(run["instances"][0]["requested_at"]))
    if start.month != end.month:
        end = end.replace(day=1, hour=0, minute=0) - dt.timedelta(minutes=5)
    return recorded.moved(run, end - recorded.at(run["instances"][-1]["ended_at"]))


def field(html: str, name: str) -> tuple[str, str]:
    """(data-exact, text) of the first element with data-field `name`."""
    found = re.search(rf'data-field="{name}"(?: id="[^"]*")? data-exact="([^"]*)">([^<]*)<', html)
    assert found, name
    return found[1], found[2]


def line(text: str, label: str) -> str:
    found = re.search(rf"(?m)^{re.escape(label)}\s+(.+)$", text)
    assert found, (label, text)
    return found[1]


def test_every_figure_of_a_recorded_run_agrees_with_the_others(cli):  # noqa: F811
    run = recent_run()
    member = cli.setup.people["member"]
    job, _ = recorded.load(cli.setup.team, member.user, run)
    month = recorded.at(run["instances"][-1]["ended_at"]).strftime("%Y-%m")
    api = client_for(member)
    page = Client()
    page.force_login(member.user)

    # ---- money -------------------------------------------------------------------------
    exact = api.get(f"/api/v1/jobs/{job.pk}/cost/").json()
    assert Decimal(exact["spent"]) + Decimal(exact["savings"]) == Decimal(exact["on_demand_baseline"])
    assert 0 < Decimal(exact["spent"]) < Decimal(exact["on_demand_baseline"])  # spot at 0.30-0.34 of 1.00 $/h
    expected = money_figures(exact["spent"], exact["savings"], exact["on_demand_baseline"])
    shown = {}  # where -> (spent, on-demand or None where not shown, saved) as read there

    html = page.get(f"/jobs/{job.pk}/").content.decode()
    (spent_exact, spent), (saved_exact, saved) = field(html, "spent"), field(html, "savings")
    assert (spent_exact, saved_exact) == (exact["spent"], exact["savings"])
    shown["job page"] = (spent, None, saved)
    money = page.get(f"/jobs/{job.pk}/status.json").json()["money"]
    shown["job page, live"] = (money["spent_display"], None, money["savings_display"])
    row = page.get("/jobs.json").json()["rows"][0]
    shown["jobs list"] = (row["spent_display"], None, row["savings_display"])
    team = page.get(f"/teams/{cli.setup.team.pk}/status.json?month={month}").json()
    shown["team overview"] = (team["money"]["spent_display"], None, team["money"]["savings_display"])

    report_html = page.get(f"/teams/{cli.setup.team.pk}/report/?from={month}&to={month}").content.decode()
    shown["report page"] = tuple(field(report_html, name)[1] for name in ("spent", "on_demand_baseline", "savings"))
    job_row = report_html[report_html.index(f'<tr data-job="{job.pk}">'):]
    shown["report page, job"] = tuple(field(job_row, name)[1] for name in ("spent", "on_demand_baseline", "savings"))
    month_row = re.search(rf'<tr data-month="{month}">(.*?)</tr>', report_html, re.S)[1]
    shown["report page, month"] = tuple(re.findall(r'<td class="num"[^>]*>([^<]*)</td>', month_row)[:3])
    report = api.get(f"/api/v1/teams/{cli.setup.team.pk}/report/", {"from": month, "to": month}).json()
    assert Decimal(report["totals"]["spent"]) + Decimal(report["totals"]["savings"]) == \
        Decimal(report["totals"]["on_demand_baseline"])
    assert [(r["spent"], r["savings"]) for r in report["jobs"]] == [(exact["spent"], exact["savings"])]

    cost = cli("cost", str(job.pk))
    assert cost.returncode == 0, cost.stderr
    shown["respawn cost"] = (line(cost.stdout, "spent"), line(cost.stdout, "on-demand would cost"),
                             line(cost.stdout, "savings"))
    instance_rows = [re.findall(DOLLARS, text)[:3] for text in cost.stdout.splitlines()
                     if re.match(r"\d+\s+\d+\s", text)]
    assert len(instance_rows) == len(run["instances"])
    for spent, on_demand, saved in instance_rows:  # each VM's figures add up as read too
        assert amount(spent) + amount(saved) == amount(on_demand), (spent, on_demand, saved)
    report_cli = cli("report", "--from", month, "--to", month)
    assert report_cli.returncode == 0, report_cli.stderr
    shown["respawn report"] = (line(report_cli.stdout, "spent"), line(report_cli.stdout, "on-demand for the same work"),
                               line(report_cli.stdout, "saved"))
    for label, prefix in (("job", rf"{job.pk}\s"), ("month", rf"{month}\s")):
        text = next(t for t in report_cli.stdout.splitlines() if re.match(prefix, t))
        shown[f"respawn report, {label}"] = tuple(re.findall(DOLLARS, text)[:3])

    for where, (spent, on_demand, saved) in shown.items():
        assert (spent, on_demand or expected["on_demand_baseline"], saved) == (
            expected["spent"], expected["on_demand_baseline"], expected["savings"]), where
    assert amount(expected["spent"]) + amount(expected["savings"]) == amount(expected["on_demand_baseline"])

    # ---- counters ----------------------------------------------------------------------
    interrupted = {row["instance_id"] for row in run["interruptions"] if row["kind"] in CLOUD_CAUSED}
    assert len(interrupted) == 4 and run["job"]["preemptions"] == len(interrupted)  # as the control plane counted
    detail = api.get(f"/api/v1/jobs/{job.pk}/").json()
    counted = {
        "job page": int(re.search(r'data-field="preemptions">(\d+)<', html)[1]),
        "job page, live": page.get(f"/jobs/{job.pk}/status.json").json()["job"]["preemptions"],
        "API": detail["preemptions"],
        "report": report["jobs"][0]["preemptions"],
        "report page": int(re.findall(r'<td class="num">(\d+)</td>', job_row)[0]),
        "respawn show": int(line(cli("show", str(job.pk)).stdout, "preemptions")),
        "downtime table": html.count("<tr><td><time "),
        "API interruptions": len(detail["interruptions"]),
        "team overview": sum(r["count"] for r in team["interruptions"]),
    }
    assert counted == dict.fromkeys(counted, len(interrupted))

    # ---- rates -------------------------------------------------------------------------
    rates = [r for r in api.get("/api/v1/interruption-rates/").json() if r["events"]]
    assert rates, "the run's interruptions weigh in placement's estimates"
    assert sum(r["events"] for r in rates) == len(interrupted)  # "Seen": this team's VMs the cloud interrupted
    for r in rates:
        assert r["per_hour_low"] <= r["per_hour"] <= r["per_hour_high"], r
    team_html = page.get(f"/teams/{cli.setup.team.pk}/?month={month}").content.decode()
    pairs = re.findall(r'data-field="per-hour">([^<]*)</td><td class="num" data-field="credible">([^<]*)<', team_html)
    assert len(pairs) >= len(rates)
    for point, interval in pairs:
        low, high = interval.split("–")
        assert Decimal(low) <= Decimal(point) <= Decimal(high), (point, interval)

    # ---- units -------------------------------------------------------------------------
    assert team["money"]["gpu_hours"] == "0.00"  # cpu-small VMs: no GPU
    assert "gpu" not in (cost.stdout + report_cli.stdout).lower()
