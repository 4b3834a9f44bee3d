"""Cost endpoints of the people's API: a job's money and a team's month.

Money is a decimal string (exact, 8 places) so no client rounds it twice.
Another team's job or team answers 404, like every other object of the API.

`spent` is the spot work's own cost, the figure `savings` is taken from; what drills
spent (a rehearsed interruption's lost work and its replacements' boot) is `drills`,
apart, and `billed` is both: what the cloud charged."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import APIException, PermissionDenied, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from respawn_server.jobs.models import Job, Team
from respawn_server.jobs.money import costs
from respawn_server.jobs.people.permissions import can, visible_team_ids


def money(value) -> str:
    return f"{value.quantize(costs.ledger.MONEY_QUANTUM):f}"  # never "0E-8"


def drill_data(drill: costs.ledger.Drill) -> dict:
    return {**{part: money(getattr(drill, part)) for part in costs.ledger.Drill.PARTS}, "total": money(drill.total)}


def job_cost_data(cost: costs.JobCost) -> dict:
    result = cost.ledger
    return {
        "job": cost.job_id,
        "as_of": cost.now.isoformat(),
        "spent": money(result.spot_spent),
        "on_demand_baseline": money(result.baseline),
        "savings": money(result.savings),
        "drills": drill_data(result.drill),
        "billed": money(result.spent),
        "waste": {
            "recomputed": money(result.waste.recomputed),
            "boot_restore": money(result.waste.boot_restore),
            "checkpoint_stalls": money(result.waste.checkpoint_stalls),
            "stopped_disk": money(result.waste.stopped_disk),
            "total": money(result.waste.total),
        },
        "by_month": {m: {"spent": money(row.spent - row.drill), "on_demand_baseline": money(row.baseline),
                         "savings": money(row.savings), "waste": money(row.waste), "drills": money(row.drill)}
                     for m, row in result.by_month.items()},
        "instances": [_instance_data(cost.work[int(row.instance_id)], row) for row in result.instances],
    }


def _instance_data(work: costs.InstanceWork, row) -> dict:
    return {
        "instance": work.instance_id,
        "rank": work.rank,
        "billed_from": work.billed_from.isoformat(),
        "billed_to": work.billed_to.isoformat() if work.billed_to else None,
        "billed_seconds": row.billed_seconds,
        "spent": money(row.spot_spent),
        "on_demand_baseline": money(row.baseline),
        "savings": money(row.savings),
        "drills": money(row.drill.total),
        "billed": money(row.spent),
        "steps_kept": work.steps_kept,
        "recomputed_steps": work.recomputed_steps,
        "seconds_per_step": str(work.seconds_per_step),
        "boot_restore_seconds": str(work.boot_restore_seconds),
        "checkpoint_stall_seconds": str(work.checkpoint_stall_seconds),
        "stopped_disk": _stopped_disk_data(work, row),
    }


def _stopped_disk_data(work: costs.InstanceWork, row) -> dict | None:
    """The disk its evicted, stopped VM kept, billed from its end until the VM was deleted
    (`billed_to` None: not yet); its money is part of the instance's `spent`."""
    if not work.stopped_disk:
        return None
    return {
        "sku": work.stopped_disk,
        "billed_from": work.billed_to.isoformat(),
        "billed_to": work.disk_released.isoformat() if work.disk_released else None,
        "billed_seconds": row.stopped_disk_seconds,
        "spent": money(row.waste.stopped_disk),
    }


def team_month_data(cost: costs.TeamMonthCost) -> dict:
    return {
        "team": cost.team_id,
        "month": cost.month,
        "as_of": cost.now.isoformat(),
        "spent": money(cost.spent - cost.drill),
        "on_demand_baseline": money(cost.baseline),
        "savings": money(cost.savings),
        "drills": money(cost.drill),
        "billed": money(cost.spent),
        "waste": money(cost.waste),
        "budget": str(cost.budget) if cost.budget is not None else None,
        "gpu_hours": str(cost.gpu_hours),
        "jobs": cost.jobs,
    }


def _money_field():
    return serializers.CharField(help_text="USD, exact decimal string")


WasteAnswer = inline_serializer("Waste", {
    "recomputed": _money_field(), "boot_restore": _money_field(), "checkpoint_stalls": _money_field(),
    "stopped_disk": serializers.CharField(
        help_text="USD, exact decimal string: the disk an evicted VM kept while stopped (Azure, eviction policy "
                  "Deallocate), billed from the instance's end until the VM was deleted; part of spent too"),
    "total": _money_field(),
})
def _drills_field():
    return serializers.CharField(help_text="USD, exact decimal string: what drills spent (their lost work and their "
                                           "replacements' boot), apart from spent and savings; billed holds it")


def _billed_field():
    return serializers.CharField(help_text="USD, exact decimal string: spent plus drills, what the cloud charged")


DrillMoneyAnswer = inline_serializer("DrillMoney", {
    "lost_work": serializers.CharField(help_text="USD: the steps the drilled VMs had run past the save, run again"),
    "replacement_boot": serializers.CharField(help_text="USD: the replacements' boot and restore"),
    "total": _money_field(),
})
JobCostAnswer = inline_serializer("JobCost", {
    "job": serializers.IntegerField(), "as_of": serializers.DateTimeField(), "spent": _money_field(),
    "on_demand_baseline": _money_field(), "savings": _money_field(), "drills": DrillMoneyAnswer,
    "billed": _billed_field(),
    "waste": WasteAnswer,
    "by_month": serializers.DictField(child=serializers.DictField(child=_money_field())),
    "instances": serializers.ListField(child=serializers.DictField()),
})
TeamCostAnswer = inline_serializer("TeamMonthCost", {
    "team": serializers.IntegerField(), "month": serializers.CharField(), "as_of": serializers.DateTimeField(),
    "spent": _money_field(), "on_demand_baseline": _money_field(), "savings": _money_field(),
    "drills": _drills_field(), "billed": _billed_field(),
    "waste": _money_field(), "budget": serializers.CharField(allow_null=True),
    "gpu_hours": serializers.CharField(), "jobs": serializers.IntegerField(),
})


def _scoped(request, model, pk, action):
    """The object if its team is visible (else 404) and the role allows `action` (else 403)."""
    team_field = "pk" if model is Team else "team_id"
    obj = get_object_or_404(model.objects.filter(**{f"{team_field}__in": visible_team_ids(request.user)}), pk=pk)
    if not can(request.user, action, obj.pk if model is Team else obj.team_id):
        raise PermissionDenied(f"Your role in this team cannot do {action}.")
    return obj


class Unpriceable(APIException):
    """The price book has a hole (no quote in force for a billed second): the
    figures would be wrong, so none are given; the detail names the instance."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "unpriceable"


class JobCostView(APIView):
    @extend_schema(responses=JobCostAnswer, summary="A job's spend, on-demand baseline, savings and waste")
    def get(self, request, pk):
        job = _scoped(request, Job, pk, "job.view")
        try:
            return Response(job_cost_data(costs.job_cost(job)))
        except costs.CostError as exc:
            raise Unpriceable(str(exc)) from exc


class TeamCostView(APIView):
    @extend_schema(responses=TeamCostAnswer, summary="A team's money in one UTC month",
                   parameters=[OpenApiParameter("month", str, description="YYYY-MM (UTC); this month when empty")])
    def get(self, request, pk):
        team = _scoped(request, Team, pk, "team.view")
        month = request.query_params.get("month")
        try:
            costs.parse_month(month, timezone.now())
        except costs.CostError as exc:
            raise ValidationError({"month": [str(exc)]}) from exc
        try:
            return Response(team_month_data(costs.team_month_cost(team, month)))
        except costs.CostError as exc:
            raise Unpriceable(str(exc)) from exc
