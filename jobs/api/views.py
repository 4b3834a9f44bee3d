"""The people's API (/api/v1/): thin viewsets over one team-scoping base."""

from __future__ import annotations

import django_filters
from django.contrib.auth import authenticate
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response
from rest_framework.views import APIView

from respawn_server.jobs.api import serializers as s
from respawn_server.jobs.api.errors import Unauthorized
from respawn_server.jobs.api.filters import IdFilterSet
from respawn_server.jobs.core.choices import JobStatus
from respawn_server.jobs.core.joblogs import BadCursor, read_job_logs
from respawn_server.jobs.core.services import cancel_job
from respawn_server.jobs.fleet.placement import interruption_rates
from respawn_server.jobs.models import Checkpoint, Instance, InterruptionEvent, Job, PriceQuote, Team
from respawn_server.jobs.people.permissions import can, visible_team_ids
from respawn_server.jobs.people.ratelimit import LOGIN, SharedRateThrottle
from respawn_server.jobs.people.team_admin import issue_token


class TeamRolePermission(permissions.BasePermission):
    """Consults the one permission table for the view's action on the object's team."""

    def has_object_permission(self, request, view, obj):
        return can(request.user, view.permission_for_action(), view.team_id_of(obj))


class TeamScopedViewSet(viewsets.GenericViewSet):
    """Objects of teams the user is not in are filtered out (404); within a team
    the role decides (403)."""

    permission_classes = [permissions.IsAuthenticated, TeamRolePermission]
    team_path = "team"  # ORM path from the model to its Team
    permissions_by_action: dict[str, str] = {}

    def permission_for_action(self) -> str:
        return self.permissions_by_action[self.action]

    def team_id_of(self, obj) -> int:
        target = obj
        for part in self.team_path.split("__"):
            target = getattr(target, part)
        return target.pk

    def get_queryset(self):
        return super().get_queryset().filter(**{f"{self.team_path}__in": visible_team_ids(self.request.user)})


class JobFilter(IdFilterSet):
    status = django_filters.MultipleChoiceFilter(choices=JobStatus.CHOICES)
    owner = django_filters.CharFilter(field_name="owner__username")
    search = django_filters.CharFilter(field_name="name", lookup_expr="icontains")

    class Meta:
        model = Job
        fields = ["status", "team", "owner", "search"]


class JobViewSet(TeamScopedViewSet, mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin):
    queryset = Job.objects.select_related("owner", "newest_checkpoint", "newest_valid_checkpoint", "team",
                                          "source_archive")
    serializer_class = s.JobSerializer
    filterset_class = JobFilter
    permissions_by_action = {
        "list": "job.view",
        "retrieve": "job.view",
        "create": "job.create",
        "cancel": "job.cancel",
        "events": "job.view",
        "logs": "job.view",
    }

    def get_serializer_class(self):
        return s.JobDetailSerializer if self.action == "retrieve" else s.JobSerializer

    def perform_create(self, serializer):
        team = serializer.validated_data["team"]  # one of the requester's teams (TeamField)
        if not can(self.request.user, "job.create", team.pk):
            raise PermissionDenied("Your role in this team cannot submit jobs.")
        serializer.save(owner=self.request.user)

    @extend_schema(request=None, responses={202: s.JobSerializer, 409: None})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        job = self.get_object()
        if not cancel_job(job, by=request.user):
            return Response({"detail": f"job is already {job.status}"}, status=status.HTTP_409_CONFLICT)
        job.refresh_from_db()
        return Response(self.get_serializer(job).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses=s.JobEventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request, pk=None):
        job = self.get_object()
        page = self.paginate_queryset(job.events.all())
        return self.get_paginated_response(s.JobEventSerializer(page, many=True).data)

    @extend_schema(parameters=[s.LOGS_AFTER_PARAMETER], responses=s.JobLogsSerializer)
    @action(detail=True, methods=["get"])
    def logs(self, request, pk=None):
        """The trainer output of the job's instances in order, from the cursor `after` on."""
        try:
            page = read_job_logs(self.get_object(), request.query_params.get("after", ""))
        except BadCursor as e:
            return Response({"detail": str(e), "errors": {"after": [str(e)]}}, status=status.HTTP_400_BAD_REQUEST)
        return Response(s.JobLogsSerializer(page).data)


class InstanceViewSet(TeamScopedViewSet, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    queryset = Instance.objects.select_related("job__team")
    serializer_class = s.InstanceSerializer
    team_path = "job__team"
    filterset_fields = ["job", "state", "provider", "market"]
    permissions_by_action = {"list": "instance.view", "retrieve": "instance.view"}


class CheckpointViewSet(TeamScopedViewSet, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    queryset = Checkpoint.objects.select_related("job__team")
    serializer_class = s.CheckpointSerializer
    team_path = "job__team"
    filterset_fields = ["job", "validation", "kind"]
    permissions_by_action = {"list": "checkpoint.view", "retrieve": "checkpoint.view"}


class InterruptionViewSet(TeamScopedViewSet, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    queryset = InterruptionEvent.objects.select_related("instance__job__team")
    serializer_class = s.InterruptionSerializer
    team_path = "instance__job__team"
    filterset_fields = {"instance__job": ["exact"], "kind": ["exact"], "source": ["exact"]}
    permissions_by_action = {"list": "interruption.view", "retrieve": "interruption.view"}


class TeamViewSet(TeamScopedViewSet, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    queryset = Team.objects.all()
    serializer_class = s.TeamSerializer
    team_path = "pk"
    permissions_by_action = {"list": "team.view", "retrieve": "team.view"}

    def team_id_of(self, obj) -> int:
        return obj.pk

    def get_queryset(self):
        return Team.objects.filter(pk__in=visible_team_ids(self.request.user))


class PriceQuoteViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = PriceQuote.objects.all()
    serializer_class = s.PriceQuoteSerializer
    filterset_fields = ["provider", "region", "zone", "instance_type", "market"]


class TokenView(APIView):
    """Exchange a username and password for a personal API token (shown once)."""

    authentication_classes = []
    permission_classes = [permissions.AllowAny]
    throttle_classes = [SharedRateThrottle]
    throttle_scope = LOGIN

    @extend_schema(request=s.LoginSerializer, responses={201: s.TokenAnswerSerializer})
    def post(self, request):
        body = s.LoginSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        user = authenticate(request, username=body.validated_data["username"], password=body.validated_data["password"])
        if user is None:
            raise Unauthorized("Wrong username or password.")
        name = body.validated_data["token_name"]
        _, token = issue_token(user, name, via="login")
        return Response({"token": token, "name": name}, status=status.HTTP_201_CREATED)


class InterruptionRateView(APIView):
    """Estimated interruption rates per placement (survival estimate with a prior from
    published frequency buckets), as placement and the checkpoint interval use them:
    for people in a team, with their teams' own evidence (respawn_server.jobs.fleet.placement.interruption_rates)."""

    @extend_schema(responses=s.InterruptionRateSerializer(many=True))
    def get(self, request):
        teams = visible_team_ids(request.user)
        if not teams:
            raise PermissionDenied("Interruption rates are for members of a team.")
        return Response(s.InterruptionRateSerializer(interruption_rates(teams), many=True).data)
