"""Team administration (/api/v1/teams/{team}/members/, /limits/): anyone in the
team may read, admins change ("team.manage"). A team the user is not in is 404."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import generics, mixins, serializers, status, viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from respawn_server.jobs.api.invitations import InvitationSerializer
from respawn_server.jobs.api.serializers import RefusesUnknownFields
from respawn_server.jobs.core.choices import Role
from respawn_server.jobs.models import Invitation, Membership, Team
from respawn_server.jobs.people.permissions import can, visible_team_ids
from respawn_server.jobs.people.team_admin import (
    CEILINGS,
    LIMIT_FIELDS,
    LastAdminError,
    add_member,
    ceiling_problem,
    change_limits,
    change_role,
    remove_member,
)


class TeamFromUrl:
    """Resolves `team_pk` from the URL before any work: a team you are not in is
    404, a role too low for the action is 403 (from the one permission table)."""

    permissions_by_action: dict[str, str] = {}

    def required_action(self) -> str:
        return self.permissions_by_action[getattr(self, "action", None) or self.request.method]

    def check_permissions(self, request):
        super().check_permissions(request)
        self.team = get_object_or_404(Team, pk=self.kwargs["team_pk"], pk__in=visible_team_ids(request.user))
        if not can(request.user, self.required_action(), self.team.pk):
            self.permission_denied(request, message=f"Your role in team {self.team.name} cannot do this.")


class MembershipSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Membership
        fields = ["username", "role"]


class AddMemberSerializer(serializers.Serializer):
    username = serializers.CharField()
    role = serializers.ChoiceField(choices=Role.ALL)

    def validate_username(self, value):
        """The user itself, so the view need not look it up again."""
        user = get_user_model().objects.filter(username=value).first()
        if user is None:
            raise ValidationError(f"no user named {value!r}")
        if Membership.objects.filter(team=self.context["team"], user=user).exists():
            raise ValidationError(f"{value} is already in the team")
        if Invitation.objects.filter(team=self.context["team"], user=user).exists():
            raise ValidationError(f"{value} is already invited")
        return user


class RoleSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.ALL)


class MemberViewSet(TeamFromUrl, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = MembershipSerializer
    lookup_field = "user__username"
    lookup_url_kwarg = "username"
    lookup_value_regex = r"[\w.@+-]+"
    permissions_by_action = {
        "list": "team.view", "retrieve": "team.view",
        "create": "team.manage", "partial_update": "team.manage", "destroy": "team.manage",
    }

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: no request, no team
            return Membership.objects.none()
        return Membership.objects.filter(team=self.team).select_related("user").order_by("user__username")

    def get_serializer_context(self):
        return {**super().get_serializer_context(), "team": getattr(self, "team", None)}

    @extend_schema(request=AddMemberSerializer, responses={201: MembershipSerializer, 202: InvitationSerializer})
    def create(self, request, team_pk=None):
        """Staff add the person (201); a team admin invites them (202), and they join
        once they accept (/api/v1/invitations/)."""
        body = AddMemberSerializer(data=request.data, context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        added = add_member(self.team, body.validated_data["username"], body.validated_data["role"], by=request.user)
        if isinstance(added, Invitation):
            return Response(InvitationSerializer(added).data, status=status.HTTP_202_ACCEPTED)
        return Response(self.get_serializer(added).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=RoleSerializer, responses={200: MembershipSerializer, 409: None})
    def partial_update(self, request, team_pk=None, username=None):
        membership = self.get_object()
        body = RoleSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            change_role(membership, body.validated_data["role"], by=request.user)
        except LastAdminError as e:
            return Response({"detail": str(e)}, status=status.HTTP_409_CONFLICT)
        return Response(self.get_serializer(membership).data)

    @extend_schema(responses={204: None, 409: None})
    def destroy(self, request, team_pk=None, username=None):
        try:
            remove_member(self.get_object(), by=request.user)
        except LastAdminError as e:
            return Response({"detail": str(e)}, status=status.HTTP_409_CONFLICT)
        return Response(status=status.HTTP_204_NO_CONTENT)


class TeamLimitsSerializer(RefusesUnknownFields, serializers.ModelSerializer):
    """The team's limits, and the ceilings deployment staff set on them (read-only here;
    the Django admin sets them). `context["by"]`: who asks for the change."""

    class Meta:
        model = Team
        fields = [*LIMIT_FIELDS, *CEILINGS.values()]
        read_only_fields = list(CEILINGS.values())
        extra_kwargs = {
            "monthly_budget_usd": {"min_value": 0, "help_text": "USD per calendar month (UTC); null: no budget."},
            "max_concurrent_gpus": {"help_text": "GPUs the team's running jobs may hold at once; null: no limit."},
        }

    def validate(self, attrs):
        problems = {field: [problem] for field, value in attrs.items()
                    if (problem := ceiling_problem(self.instance, field, value, by=self.context["by"]))}
        if problems:
            raise ValidationError(problems)
        return attrs


class TeamLimitsView(TeamFromUrl, generics.GenericAPIView):
    serializer_class = TeamLimitsSerializer
    permissions_by_action = {"GET": "team.view", "PATCH": "team.manage"}

    def get(self, request, team_pk=None):
        return Response(self.get_serializer(self.team).data)

    def get_serializer_context(self):
        return {**super().get_serializer_context(), "by": self.request.user}

    def patch(self, request, team_pk=None):
        body = self.get_serializer(self.team, data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        team = change_limits(self.team, by=request.user, **body.validated_data)
        return Response(self.get_serializer(team).data)
