"""The audit log (/api/v1/audit/), readable by team admins ("audit.view").

An admin sees their teams' events and their own personal ones (tokens created or
revoked), never another person's: a member's tokens are their own affair, and
anyone a team admin once invited would otherwise be open to them."""

from __future__ import annotations

import django_filters
from django.db.models import Q
from rest_framework import mixins, serializers, viewsets
from rest_framework.exceptions import PermissionDenied

from respawn_server.jobs.api.filters import IdFilterSet, UtcDateTimeFilter
from respawn_server.jobs.core.choices import AuditAction
from respawn_server.jobs.models import AuditEvent
from respawn_server.jobs.people.permissions import can, roles_of


class AuditEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_username")

    class Meta:
        model = AuditEvent
        fields = ["id", "created_at", "actor", "team", "action", "target", "details"]


class AuditFilter(IdFilterSet):
    action = django_filters.MultipleChoiceFilter(choices=AuditAction.CHOICES)
    actor = django_filters.CharFilter(field_name="actor_username")
    since = UtcDateTimeFilter(field_name="created_at", lookup_expr="gte")
    until = UtcDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = AuditEvent
        fields = ["action", "actor", "team", "target", "since", "until"]


class AuditEventViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    serializer_class = AuditEventSerializer
    filterset_class = AuditFilter

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: nobody to scope to
            return AuditEvent.objects.none()
        user = self.request.user
        teams = [team_id for team_id in roles_of(user) if can(user, "audit.view", team_id)]
        if not teams:
            raise PermissionDenied("The audit log is readable by team admins.")
        return AuditEvent.objects.filter(Q(team__in=teams) | Q(team__isnull=True, actor=user))
