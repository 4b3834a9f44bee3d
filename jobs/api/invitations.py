"""A person's invitations to teams (/api/v1/invitations/): list, accept, decline.

A team admin cannot put anyone in their team: they invite, and the person joins
only by accepting here or on the dashboard. Another person's invitation does not
exist for you (404)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from respawn_server.jobs.models import Invitation
from respawn_server.jobs.people.team_admin import accept_invitation, decline_invitation

ANSWERED = "the invitation was already answered"


class InvitationSerializer(serializers.ModelSerializer):
    team_name = serializers.CharField(source="team.name", read_only=True)
    username = serializers.CharField(source="user.username", read_only=True)
    invited_by = serializers.CharField(source="invited_by.username", read_only=True, default=None)

    class Meta:
        model = Invitation
        fields = ["id", "team", "team_name", "username", "role", "invited_by", "created_at"]


class InvitationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = InvitationSerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: nobody signed in
            return Invitation.objects.none()
        return (Invitation.objects.filter(user=self.request.user).select_related("team", "user", "invited_by")
                .order_by("-created_at", "-id"))

    @extend_schema(request=None, responses={200: None, 409: None})
    @action(detail=True, methods=["post"])
    def accept(self, request, pk=None):
        membership = accept_invitation(self.get_object())
        if membership is None:
            return Response({"detail": ANSWERED}, status=status.HTTP_409_CONFLICT)
        return Response({"team": membership.team_id, "role": membership.role})

    @extend_schema(request=None, responses={204: None, 409: None})
    @action(detail=True, methods=["post"])
    def decline(self, request, pk=None):
        if not decline_invitation(self.get_object()):
            return Response({"detail": ANSWERED}, status=status.HTTP_409_CONFLICT)
        return Response(status=status.HTTP_204_NO_CONTENT)
