"""drf-spectacular: our two bearer-token schemes, and the error answers every
operation can give, in the one error shape of jobs/api/errors.py, so a client
(and the schema fuzz tests) can rely on the schema for failures too."""

from drf_spectacular.extensions import (OpenApiAuthenticationExtension, OpenApiSerializerExtension,
                                        OpenApiSerializerFieldExtension)
from drf_spectacular.openapi import AutoSchema
from rest_framework import permissions, serializers
from rest_framework.authentication import SessionAuthentication


class PersonalTokenScheme(OpenApiAuthenticationExtension):
    target_class = "respawn_server.jobs.people.auth.HashedTokenAuthentication"
    name = "personalToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "Personal API token (rsp_…)."}


class AgentTokenScheme(OpenApiAuthenticationExtension):
    target_class = "respawn_server.jobs.people.auth.AgentTokenAuthentication"
    name = "agentToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "Per-instance agent token (rsa_…)."}


class HeartbeatTokenScheme(OpenApiAuthenticationExtension):
    """The heartbeat's narrower lookup of the same agent token: it names the scheme
    AgentTokenScheme defines and defines none of its own (one component, one class)."""

    target_class = "respawn_server.jobs.people.auth.HeartbeatTokenAuthentication"
    name: list[str] = []

    def get_security_requirement(self, auto_schema):
        return {AgentTokenScheme.name: []}

    def get_security_definition(self, auto_schema):
        return []


class BootstrapTokenScheme(OpenApiAuthenticationExtension):
    target_class = "respawn_server.jobs.people.auth.BootstrapTokenAuthentication"
    name = "bootstrapToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer",
                "description": "A VM's single-use bootstrap token (rsb_…), before its agent registers with it."}


class BootstrapOrAgentTokenScheme(OpenApiAuthenticationExtension):
    """Either scheme above, named, not defined again."""

    target_class = "respawn_server.jobs.people.auth.BootstrapOrAgentTokenAuthentication"
    name: list[str] = []

    def get_security_requirement(self, auto_schema):
        return [{BootstrapTokenScheme.name: []}, {AgentTokenScheme.name: []}]

    def get_security_definition(self, auto_schema):
        return []


class RefusesUnknownFieldsScheme(OpenApiSerializerExtension):
    """Such a request body takes no property beyond those listed (a 400 names any other)."""

    target_class = "respawn_server.jobs.api.serializers.RefusesUnknownFields"
    match_subclasses = True

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        if direction == "request":
            schema["additionalProperties"] = False
        return schema


class TeamFieldScheme(OpenApiSerializerFieldExtension):
    """Sent as a name or an id; answered as the id."""

    target_class = "respawn_server.jobs.api.serializers.TeamField"

    def map_serializer_field(self, auto_schema, direction):
        if direction == "request":
            return {"oneOf": [{"type": "integer"}, {"type": "string"}], "description": "The team's name or id."}
        return {"type": "integer", "description": "The team's id."}


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()
    errors = serializers.DictField(required=False, help_text="400 only: each bad field with its messages.")


OPEN_PERMISSIONS = (permissions.AllowAny, permissions.IsAuthenticated)


class RespawnAutoSchema(AutoSchema):
    def get_operation(self, *args, **kwargs):
        operation = super().get_operation(*args, **kwargs)
        if operation is not None:
            for code in self.error_codes(operation):
                operation["responses"].setdefault(code, self._get_response_for_code(ErrorSerializer, code))
        return operation

    def error_codes(self, operation) -> list[str]:
        view, where = self.view, {p["in"] for p in operation.get("parameters", [])}
        codes = []
        if "requestBody" in operation or "query" in where:
            codes.append("400")
        codes.append("401")  # every view checks a token, a session or credentials in its body
        role_checked = any(not issubclass(p, OPEN_PERMISSIONS) for p in view.permission_classes)
        csrf_checked = self.method not in permissions.SAFE_METHODS and any(
            issubclass(a, SessionAuthentication) for a in view.authentication_classes)
        if role_checked or csrf_checked:
            codes.append("403")
        if "path" in where:
            codes.append("404")
        if "requestBody" in operation:  # over the agent API's cap or DATA_UPLOAD_MAX_MEMORY_SIZE
            codes.append("413")
        if view.throttle_classes:
            codes.append("429")
        return codes
