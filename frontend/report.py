"""The team's savings report page: the API's report (`respawn_server.jobs.api.report`), drawn as tables and a
cumulative savings chart, with the same figures offered as CSV and JSON."""

from __future__ import annotations

from decimal import Decimal

from django.contrib.auth.decorators import login_required
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode

from respawn_server.frontend import access
from respawn_server.frontend.money import WASTE_PARTS
from respawn_server.frontend.views import page
from respawn_server.jobs.api.report import TABLES, report_data
from respawn_server.jobs.money.report import ReportError, savings_report
from respawn.vocabulary.money import money_figures, usd


def _displayed(data: dict) -> dict:
    """Money as people read it beside the exact strings the API gives."""
    for row in (*data["months"], *data["jobs"], data["totals"]):
        for name, text in money_figures(row["spent"], row["savings"], row["on_demand_baseline"]).items():
            row[f"{name}_display"] = text
        row["waste_display"] = usd(row["waste"])
        drills = row["drills"]["total"] if isinstance(row["drills"], dict) else row["drills"]
        row["drills_display"] = usd(drills) if Decimal(drills) else ""  # shown apart, for what was drilled
    # A year's range of a team that ran in two months: the other ten are rows of zeros. The
    # CSV and JSON keep every month (a series); people read the months that had jobs.
    data["empty_months"] = sum(1 for m in data["months"] if not m["jobs"])
    data["months"] = [m for m in data["months"] if m["jobs"]]
    data["waste_rows"] = [{"kind": label, "usd": data["waste"][part], "display": usd(data["waste"][part])}
                          for part, label in WASTE_PARTS]
    return data


@login_required
def report_page(request, pk: int):
    team = access.scoped_team(request.user, pk, "team.view")
    first, last = request.GET.get("from") or None, request.GET.get("to") or None
    try:
        report = savings_report(team, first, last, timezone.now())
    except ReportError as exc:
        return page(request, "frontend/error.html", http_status=400, message=f"{exc.field}: {exc}")
    query = {"from": report.first, "to": report.last}
    api = reverse("team-report", kwargs={"pk": team.pk})
    downloads = [{"label": f"{table} (CSV)", "url": f"{api}?{urlencode({**query, 'format': 'csv', 'table': table})}"}
                 for table in TABLES]
    downloads.append({"label": "everything (JSON)", "url": f"{api}?{urlencode(query)}"})
    return page(request, "frontend/report.html", team=team, report=_displayed(report_data(report)), downloads=downloads)
