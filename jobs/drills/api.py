"""The people's API for drills: `POST jobs/{id}/drill/` (members of the job's team) and
`GET jobs/{id}/drills/` (whoever sees the job), newest first, each with its report."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import permissions, serializers, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response
from rest_framework.views import APIView

from respawn_server.jobs.drills import report
from respawn_server.jobs.drills.services import DrillConflict, request_drill
from respawn_server.jobs.models import Job
from respawn_server.jobs.people.permissions import can, visible_team_ids

LATEST = 20  # drills listed per job: a team drills now and then, not by the thousand


class DrillRequestSerializer(serializers.Serializer):
    node = serializers.IntegerField(required=False, default=0, min_value=0,
                                    help_text="Rank of the node to interrupt; 0 when omitted.")
    without_notice = serializers.BooleanField(required=False, default=False,
                                              help_text="A hard reclaim, with no notice first.")


class DrillReportSerializer(serializers.Serializer):
    """What as_report gives (documented for the schema; the view returns it as it is)."""

    id = serializers.IntegerField()
    job = serializers.IntegerField()
    instance = serializers.IntegerField()
    rank = serializers.IntegerField()
    with_notice = serializers.BooleanField()
    requested_by = serializers.CharField()
    status = serializers.CharField()
    requested_at = serializers.DateTimeField()
    interrupted_at = serializers.DateTimeField(allow_null=True)
    notice_seen_after_s = serializers.FloatField(allow_null=True)
    save_committed_after_s = serializers.FloatField(allow_null=True)
    replacement_requested_after_s = serializers.FloatField(allow_null=True)
    replacement_booted_after_s = serializers.FloatField(allow_null=True)
    validated_after_s = serializers.FloatField(allow_null=True)
    training_again_after_s = serializers.FloatField(allow_null=True)
    steps_lost = serializers.IntegerField(allow_null=True)
    window_s = serializers.FloatField(allow_null=True)
    passed = serializers.BooleanField(allow_null=True)
    cause = serializers.CharField()
    missing_permission = serializers.CharField()
    finished_at = serializers.DateTimeField(allow_null=True)


def _job(request, pk: int) -> Job:
    """The job, if one of the requester's teams holds it (else 404: it does not exist for them)."""
    return get_object_or_404(Job.objects.filter(team__in=visible_team_ids(request.user)), pk=pk)


def drill_reports(job: Job) -> list[dict]:
    drills = job.drills.select_related("requested_by")[:LATEST]
    return [report.as_report(drill) for drill in drills]


class JobDrillView(APIView):
    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(request=DrillRequestSerializer, responses={202: DrillReportSerializer, 400: None, 409: None})
    def post(self, request, pk: int):
        job = _job(request, pk)
        if not can(request.user, "job.drill", job.team_id):
            raise PermissionDenied("Your role in this team cannot drill its jobs.")
        body = DrillRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        node = body.validated_data["node"]
        if node >= job.nodes:
            raise serializers.ValidationError({"node": [f"job {job.pk} has nodes 0..{job.nodes - 1}, not {node}"]})
        try:
            drill = request_drill(job, by=request.user, rank=node, with_notice=not body.validated_data["without_notice"])
        except DrillConflict as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(report.as_report(drill), status=status.HTTP_202_ACCEPTED)


class JobDrillsView(APIView):
    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(responses=DrillReportSerializer(many=True))
    def get(self, request, pk: int):
        return Response(drill_reports(_job(request, pk)))
