"""Source archives on the people's API (DESIGN §11): ask whether a team holds the
archive with a digest, and upload it when not (`respawn submit --workdir` does both).

    GET /api/v1/sources/sha256:<hex>/?team=N  -> {"stored": ..., "max_bytes": ...}
    PUT /api/v1/sources/sha256:<hex>/?team=N  body: the archive (application/gzip)

A job names an archive of its team by that digest (`source_archive`)."""

from __future__ import annotations

from django import forms
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import permissions, serializers, status
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from respawn.sourcetree import DIGEST_PREFIX, DIGEST_RE, MEDIA_TYPE
from respawn_server.jobs.api.errors import PayloadTooLarge
from respawn_server.jobs.api.filters import IdField
from respawn_server.jobs.core import sources
from respawn_server.jobs.people.permissions import can, visible_team_ids


class SourceAnswerSerializer(serializers.Serializer):
    digest = serializers.CharField(help_text="\"sha256:\" and the archive's 64 hex digits.")
    stored = serializers.BooleanField(help_text="The team holds this archive: a job may name it as source_archive.")
    bytes = serializers.IntegerField(allow_null=True)
    files = serializers.IntegerField(allow_null=True)
    unpacked_bytes = serializers.IntegerField(allow_null=True)
    max_bytes = serializers.IntegerField(help_text="The most bytes an archive, or the files it unpacks to, may hold.")


TEAM_PARAMETER = OpenApiParameter("team", int, required=True, description="The team the archive is for.")


class SourceView(APIView):
    permission_classes = [permissions.IsAuthenticated]
    parser_classes = []  # PUT's body is read as it streams in (respawn_server.jobs.core.sources.store), never parsed

    def _team_id(self, request) -> int:
        field = IdField()
        try:
            team_id = field.clean(request.query_params.get("team"))
        except forms.ValidationError as exc:
            raise ValidationError({"team": list(exc.messages)}) from None
        if team_id not in visible_team_ids(request.user):
            raise ValidationError({"team": [f"you are in no team {team_id}"]})
        if not can(request.user, "job.create", team_id):
            raise PermissionDenied("Your role in this team cannot submit jobs.")
        return team_id

    @staticmethod
    def _sha256(digest: str) -> str:
        if not DIGEST_RE.match(digest):
            raise ValidationError({"digest": ["must be \"sha256:\" and 64 lowercase hex digits"]})
        return digest[len(DIGEST_PREFIX):]

    @staticmethod
    def _answer(sha256: str, archive) -> dict:
        return SourceAnswerSerializer({
            "digest": DIGEST_PREFIX + sha256, "stored": archive is not None,
            "bytes": archive.bytes if archive else None, "files": archive.files if archive else None,
            "unpacked_bytes": archive.unpacked_bytes if archive else None, "max_bytes": sources.max_bytes(),
        }).data

    @extend_schema(parameters=[TEAM_PARAMETER], responses=SourceAnswerSerializer)
    def get(self, request, digest: str):
        """Whether the team holds the archive with this digest, and the size limit an upload keeps to."""
        sha256, team_id = self._sha256(digest), self._team_id(request)
        return Response(self._answer(sha256, sources.find(team_id, sha256)))

    @extend_schema(parameters=[TEAM_PARAMETER], request={MEDIA_TYPE: OpenApiTypes.BINARY},
                   responses={200: SourceAnswerSerializer, 201: SourceAnswerSerializer, 413: None})
    def put(self, request, digest: str):
        """Upload the archive (a gzip'd tar, agents/respawn/sourcetree.py) under its SHA-256, with a
        Content-Length. 201 when stored now; 200 when the team had it (the body is not read)."""
        sha256, team_id = self._sha256(digest), self._team_id(request)
        known = sources.find(team_id, sha256)
        if known is not None:
            return Response(self._answer(sha256, known))
        length = request.META.get("CONTENT_LENGTH") or ""
        if not length.isdigit():
            raise ValidationError({"Content-Length": ["required: the archive's size in bytes"]})
        try:
            archive, created = sources.store(team_id, request.user, sha256, request.stream, int(length))
        except sources.TooLarge as exc:
            raise PayloadTooLarge(str(exc)) from None
        except sources.UploadRefused as exc:
            raise ValidationError({exc.field: [str(exc)]}) from None
        return Response(self._answer(sha256, archive), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)
