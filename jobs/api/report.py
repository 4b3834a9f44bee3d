"""The team's savings report (`respawn_server.jobs.money.report`) in the people's API, as JSON or as one
of its tables in CSV (`?format=csv&table=jobs`, or `Accept: text/csv`).

Money is an exact decimal string, as in the cost endpoints: a job's row carries the very
strings `/jobs/{id}/cost/` answers, and a month's row those of `/teams/{id}/cost/`."""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass

from django.http import Http404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import NotAcceptable, ValidationError
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from respawn_server.jobs.api.costs import (DrillMoneyAnswer, _billed_field, _drills_field, _money_field, _scoped,
                                           drill_data, job_cost_data, money)
from respawn_server.jobs.models import Team
from respawn_server.jobs.money import ledger
from respawn_server.jobs.money.curve import cost_curve
from respawn_server.jobs.money.report import INTERRUPTION_KINDS, ReportError, SavingsReport, savings_report

FORMATS = ("json", "csv")
# How a cell a spreadsheet would run as a formula starts (OWASP, CSV injection); such a
# cell is written with a leading ' so it shows as text. A plain number is left alone.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
NUMBER = re.compile(r"[+-]?[0-9]+(\.[0-9]+)?")


def _job_row(row, cost_data: dict) -> dict:
    return {"job": row.job_id, "name": row.name, "status": row.status, "preemptions": row.preemptions,
            "spent": cost_data["spent"], "on_demand_baseline": cost_data["on_demand_baseline"],
            "savings": cost_data["savings"], "waste": cost_data["waste"]["total"],
            **{f"waste_{part}": cost_data["waste"][part] for part in ledger.Waste.PARTS},
            "drills": cost_data["drills"]["total"], "billed": cost_data["billed"]}


def report_data(report: SavingsReport) -> dict:
    details = {row.job_id: job_cost_data(row.cost) for row in report.jobs}
    curve = cost_curve({"instances": [i for detail in details.values() for i in detail["instances"]]}, report.now)
    return {
        "team": report.team_id, "from": report.first, "to": report.last, "as_of": report.now.isoformat(),
        "totals": {"spent": money(report.spent - report.drill.total), "on_demand_baseline": money(report.baseline),
                   "savings": money(report.savings), "waste": money(report.waste.total), "jobs": len(report.jobs),
                   "drills": drill_data(report.drill), "billed": money(report.spent)},
        "months": [{"month": m.month, "spent": money(m.spent - m.drill), "on_demand_baseline": money(m.baseline),
                    "savings": money(m.savings), "waste": money(m.waste), "jobs": m.jobs, "drills": money(m.drill),
                    "billed": money(m.spent)} for m in report.months],
        "jobs": [_job_row(row, details[row.job_id]) for row in report.jobs],
        "waste": {**{part: money(getattr(report.waste, part)) for part in ledger.Waste.PARTS},
                  "total": money(report.waste.total)},
        "interruptions": [{"cloud": z.cloud, "zone": z.zone, **z.counts, "total": z.total} for z in report.interruptions],
        "unpriced": [{"job": job_id, "error": error} for job_id, error in report.unpriced.items()],
        "cumulative": [{"at": p["at"], "spent": p["spent"], "on_demand": p["on_demand"],
                        "savings": p["on_demand"] - p["spent"]} for p in curve],
    }


@dataclass(frozen=True, slots=True)
class Table:
    columns: tuple[str, ...]
    rows: list[dict]


def _waste_rows(data: dict) -> list[dict]:
    return [{"kind": kind, "usd": usd} for kind, usd in data["waste"].items()]


# Each CSV table: its columns and where its rows are in `report_data`.
TABLES = {
    "jobs": (("job", "name", "status", "preemptions", "spent", "on_demand_baseline", "savings", "waste",
              *(f"waste_{part}" for part in ledger.Waste.PARTS), "drills", "billed"), lambda data: data["jobs"]),
    "months": (("month", "spent", "on_demand_baseline", "savings", "waste", "jobs", "drills", "billed"),
               lambda data: data["months"]),
    "waste": (("kind", "usd"), _waste_rows),
    "interruptions": (("cloud", "zone", *INTERRUPTION_KINDS, "total"), lambda data: data["interruptions"]),
    "cumulative": (("at", "spent", "on_demand", "savings"), lambda data: data["cumulative"]),
}


def report_table(data: dict, table: str) -> Table:
    columns, rows = TABLES[table]
    return Table(columns, rows(data))


def csv_text(table: Table) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=table.columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows({column: _cell(value) for column, value in row.items()} for row in table.rows)
    return out.getvalue()


def _cell(value):
    if isinstance(value, str) and value.startswith(FORMULA_STARTS) and not NUMBER.fullmatch(value):
        return "'" + value
    return value


class CSVRenderer(BaseRenderer):
    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return csv_text(data).encode(self.charset)


ReportAnswer = inline_serializer("SavingsReport", {
    "team": serializers.IntegerField(), "from": serializers.CharField(), "to": serializers.CharField(),
    "as_of": serializers.DateTimeField(),
    "totals": inline_serializer("SavingsReportTotals", {
        "spent": _money_field(), "on_demand_baseline": _money_field(), "savings": _money_field(),
        "waste": _money_field(), "jobs": serializers.IntegerField(), "drills": DrillMoneyAnswer,
        "billed": _billed_field()}),
    "months": serializers.ListField(child=inline_serializer("SavingsReportMonth", {
        "month": serializers.CharField(), "spent": _money_field(), "on_demand_baseline": _money_field(),
        "savings": _money_field(), "waste": _money_field(), "jobs": serializers.IntegerField(),
        "drills": _drills_field(), "billed": _billed_field()})),
    "jobs": serializers.ListField(child=inline_serializer("SavingsReportJob", {
        "job": serializers.IntegerField(), "name": serializers.CharField(), "status": serializers.CharField(),
        "preemptions": serializers.IntegerField(), "spent": _money_field(), "on_demand_baseline": _money_field(),
        "savings": _money_field(), "waste": _money_field(),
        **{f"waste_{part}": _money_field() for part in ledger.Waste.PARTS}, "drills": _drills_field(),
        "billed": _billed_field()})),
    "waste": serializers.DictField(child=_money_field(), help_text="USD per kind of waste, and total"),
    "interruptions": serializers.ListField(child=inline_serializer("SavingsReportZone", {
        "cloud": serializers.CharField(), "zone": serializers.CharField(),
        **{kind: serializers.IntegerField() for kind in INTERRUPTION_KINDS}, "total": serializers.IntegerField()})),
    "unpriced": serializers.ListField(child=inline_serializer("SavingsReportUnpriced", {
        "job": serializers.IntegerField(), "error": serializers.CharField()})),
    "cumulative": serializers.ListField(child=inline_serializer("SavingsReportPoint", {
        "at": serializers.DateTimeField(), "spent": serializers.FloatField(), "on_demand": serializers.FloatField(),
        "savings": serializers.FloatField()})),
})


class TeamReportView(APIView):
    renderer_classes = [JSONRenderer, CSVRenderer]

    def perform_content_negotiation(self, request, force=False):
        """An unknown `?format=` is DRF's 404 (and an unmet Accept its 406); here a 400 that names the field."""
        try:
            return super().perform_content_negotiation(request, force)
        except (Http404, NotAcceptable):
            wanted = request.query_params.get("format")
            field = "format" if wanted is not None else "Accept"
            raise ValidationError({field: [f"{field} must be one of {', '.join(FORMATS)} (got {wanted!r})"
                                           if wanted is not None else "Accept must allow application/json or text/csv"]}) from None

    def finalize_response(self, request, response, *args, **kwargs):
        if response.status_code >= 400:  # errors keep the API's one JSON shape, whatever table was asked for
            request.accepted_renderer, request.accepted_media_type = JSONRenderer(), JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)

    @extend_schema(
        summary="A team's savings report: spot spend vs on-demand per month and per job, waste, interruptions per zone",
        parameters=[
            OpenApiParameter("from", str, description="first month, YYYY-MM (UTC); 11 months before `to` when empty"),
            OpenApiParameter("to", str, description="last month, YYYY-MM (UTC); this month when empty"),
            OpenApiParameter("format", str, enum=FORMATS, description="json (default), or csv: one table, see `table`"),
            OpenApiParameter("table", str, enum=tuple(TABLES), description="the CSV's table (default jobs)"),
        ],
        responses={(200, "application/json"): ReportAnswer, (200, "text/csv"): OpenApiTypes.STR},
    )
    def get(self, request, pk):
        team = _scoped(request, Team, pk, "team.view")
        table = request.query_params.get("table") or "jobs"
        if table not in TABLES:
            raise ValidationError({"table": [f"table must be one of {', '.join(TABLES)} (got {table!r})"]})
        try:
            report = savings_report(team, request.query_params.get("from"), request.query_params.get("to"), timezone.now())
        except ReportError as exc:
            raise ValidationError({exc.field: [str(exc)]}) from exc
        data = report_data(report)
        if request.accepted_renderer.format != "csv":
            return Response(data)
        name = f"respawn-team{team.pk}-{report.first}-{report.last}-{table}.csv"
        return Response(report_table(data, table), headers={"Content-Disposition": f'attachment; filename="{name}"'})
