"""Notification subscriptions and their delivery log (/api/v1/subscriptions/, /api/v1/deliveries/).

A team's subscriptions are managed by its admins and seen by its members (a URL in
full by admins only: a Slack webhook's URL is its secret); a person's own are theirs
alone, in any team they are in. Another team's do not exist for you (404). A webhook's
signing secret is in the answer to its creation only."""

from __future__ import annotations

from urllib.parse import urlsplit

from django.db.models import Q
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from respawn_server.jobs.api.serializers import RefusesUnknownFields, TeamField
from respawn_server.jobs.core.choices import Channel, NotificationKind
from respawn_server.jobs.models import Delivery, DeliveryAttempt, Subscription
from respawn_server.jobs.notify import subscriptions
from respawn_server.jobs.notify.addresses import UnsafeURL, check_url
from respawn_server.jobs.people.permissions import can, visible_team_ids

SCOPES = ("team", "personal")


def shown_url(url: str) -> str:
    """A URL as members who may not manage it see it: where it goes, not its path (a secret)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}/…" if parts.hostname else ""


class SubscriptionSerializer(RefusesUnknownFields, serializers.ModelSerializer):
    team = TeamField()
    scope = serializers.ChoiceField(choices=SCOPES, default="personal", write_only=True,
                                    help_text="team: the team's (its admins manage it); personal: yours.")
    owner = serializers.CharField(source="user.username", read_only=True, default=None,
                                  help_text="Whose subscription; empty for the team's.")
    events = serializers.ListField(child=serializers.ChoiceField(choices=NotificationKind.SUBSCRIBABLE),
                                   allow_empty=False)

    class Meta:
        model = Subscription
        fields = ["id", "team", "scope", "owner", "name", "events", "channel", "url", "email", "preemption_burst",
                  "recovering_after_s", "enabled", "failing_reason", "failing_since", "created_at"]
        read_only_fields = ["failing_reason", "failing_since", "created_at"]

    def to_representation(self, subscription):
        answer = super().to_representation(subscription)
        if subscription.user_id is None and not can(self.context["request"].user, "subscription.manage_team",
                                                    subscription.team_id):
            answer["url"] = shown_url(subscription.url)
        return answer

    def validate_events(self, value):
        return sorted(set(value))

    def validate(self, data):
        if self.instance is not None and "team" in data and data["team"].pk != self.instance.team_id:
            raise serializers.ValidationError({"team": "a subscription cannot move to another team"})
        if self.instance is not None and "channel" in data and data["channel"] != self.instance.channel:
            raise serializers.ValidationError({"channel": "the channel cannot change; make a new subscription"})
        channel = data.get("channel", getattr(self.instance, "channel", None))
        url = data.get("url", getattr(self.instance, "url", ""))
        email = data.get("email", getattr(self.instance, "email", ""))
        if channel == Channel.EMAIL:
            if not email:
                raise serializers.ValidationError({"email": "an email subscription needs an address"})
            if url:
                raise serializers.ValidationError({"url": "an email subscription takes no url"})
        else:
            if not url:
                raise serializers.ValidationError({"url": f"a {channel} subscription needs a url"})
            if email:
                raise serializers.ValidationError({"email": f"a {channel} subscription takes no email"})
            if "url" in data:
                try:
                    check_url(url)
                except UnsafeURL as exc:
                    raise serializers.ValidationError({"url": str(exc)}) from None
        return data


class NewSubscriptionSerializer(SubscriptionSerializer):
    secret = serializers.CharField(read_only=True, help_text="A webhook's signing key: shown once, here.")

    class Meta(SubscriptionSerializer.Meta):
        fields = [*SubscriptionSerializer.Meta.fields, "secret"]


class AttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = DeliveryAttempt
        fields = ["started_at", "duration_s", "status_code", "error", "ok"]


class DeliverySerializer(serializers.ModelSerializer):
    kind = serializers.CharField(source="notification.kind")
    title = serializers.CharField(source="notification.title")
    job = serializers.IntegerField(source="notification.job_id", allow_null=True)
    attempt_log = AttemptSerializer(many=True)

    class Meta:
        model = Delivery
        fields = ["id", "subscription", "kind", "title", "job", "status", "attempts", "last_error", "created_at",
                  "delivered_at", "attempt_log"]


def visible_subscriptions(user):
    return Subscription.objects.filter(Q(user=None) | Q(user=user), team_id__in=visible_team_ids(user))


class SubscriptionViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.UpdateModelMixin,
                          mixins.DestroyModelMixin, viewsets.GenericViewSet):
    serializer_class = SubscriptionSerializer
    filterset_fields = ["team", "channel", "enabled"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: nobody signed in
            return Subscription.objects.none()
        return visible_subscriptions(self.request.user).select_related("user").order_by("team", "name", "id")

    def check_manage(self, *, team_id: int, owner_id: int | None) -> None:
        if not subscriptions.may_manage(self.request.user, team_id=team_id, owner_id=owner_id):
            raise PermissionDenied("only the team's admins manage its subscriptions")

    @extend_schema(request=SubscriptionSerializer, responses={201: NewSubscriptionSerializer})
    def create(self, request):
        body = self.get_serializer(data=request.data)
        body.is_valid(raise_exception=True)
        fields = dict(body.validated_data)
        owner = None if fields.pop("scope") == "team" else request.user
        self.check_manage(team_id=fields["team"].pk, owner_id=owner and owner.pk)
        created = subscriptions.create(**fields, user=owner, created_by=request.user)
        answer = NewSubscriptionSerializer(created, context=self.get_serializer_context()).data
        return Response({**answer, "secret": created.new_secret}, status=status.HTTP_201_CREATED)

    def perform_update(self, serializer):
        serializer.validated_data.pop("scope", None)
        self.check_manage(team_id=serializer.instance.team_id, owner_id=serializer.instance.user_id)
        serializer.save()

    def perform_destroy(self, subscription):
        self.check_manage(team_id=subscription.team_id, owner_id=subscription.user_id)
        subscription.delete()

    @extend_schema(request=None, responses={202: DeliverySerializer})
    @action(detail=True, methods=["post"])
    def test(self, request, pk=None):
        """Send a test message through this subscription (delivered by a worker; see its delivery)."""
        subscription = self.get_object()
        self.check_manage(team_id=subscription.team_id, owner_id=subscription.user_id)
        delivery = Delivery.objects.get(pk=subscriptions.send_test(subscription, request.user))
        return Response(DeliverySerializer(delivery).data, status=status.HTTP_202_ACCEPTED)


class DeliveryViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The delivery log of the subscriptions you see, newest first, each with its attempts."""

    serializer_class = DeliverySerializer
    filterset_fields = ["subscription", "status"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Delivery.objects.none()
        return (Delivery.objects.filter(subscription__in=visible_subscriptions(self.request.user))
                .select_related("notification").prefetch_related("attempt_log").order_by("-created_at", "-id"))
