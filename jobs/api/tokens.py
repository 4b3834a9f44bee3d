"""A person's own API tokens (/api/v1/tokens/): list, create (shown once), revoke.

Tokens belong to a person, not to a team: everyone signed in manages their own,
and another person's token does not exist for them (404)."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from respawn_server.jobs.models import ApiToken
from respawn_server.jobs.people.ratelimit import SharedRateThrottle
from respawn_server.jobs.people.team_admin import issue_token, revoke_token


class ApiTokenSerializer(serializers.ModelSerializer):
    current = serializers.SerializerMethodField(help_text="The token this request was made with.")

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "expires_at", "last_used_at", "revoked_at", "current"]
        read_only_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]

    def get_current(self, api_token) -> bool:
        return getattr(self.context["request"].auth, "pk", None) == api_token.pk

    def validate_expires_at(self, value):
        if value is not None and value <= timezone.now():
            raise serializers.ValidationError("expires_at is in the past")
        return value


class NewApiTokenSerializer(ApiTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="Shown once; only its digest is stored.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]


class TokenMintingThrottle(SharedRateThrottle):
    """Only minting is limited (a stolen session must not mint tokens by the
    thousand); listing and revoking stay free."""

    def allow_request(self, request, view):
        return view.action != "create" or super().allow_request(request, view)


class ApiTokenViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = ApiTokenSerializer
    throttle_classes = [TokenMintingThrottle]
    throttle_scope = "token_create"
    filterset_fields = ["name"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: nobody signed in
            return ApiToken.objects.none()
        return ApiToken.objects.filter(user=self.request.user).order_by("-created_at", "-id")

    @extend_schema(request=ApiTokenSerializer, responses={201: NewApiTokenSerializer})
    def create(self, request):
        body = ApiTokenSerializer(data=request.data, context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        api_token, secret = issue_token(request.user, body.validated_data["name"],
                                        expires_at=body.validated_data.get("expires_at"))
        answer = NewApiTokenSerializer(api_token, context=self.get_serializer_context()).data
        return Response({**answer, "token": secret}, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: ApiTokenSerializer, 409: None})
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        api_token = self.get_object()
        if not revoke_token(api_token, by=request.user):
            return Response({"detail": "token is already revoked"}, status=status.HTTP_409_CONFLICT)
        return Response(self.get_serializer(api_token).data)
