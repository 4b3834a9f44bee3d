"""drf-spectacular descriptions of our two bearer-token schemes."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class PersonalTokenScheme(OpenApiAuthenticationExtension):
    target_class = "jobs.auth.HashedTokenAuthentication"
    name = "personalToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "Personal API token (rsp_…)."}


class AgentTokenScheme(OpenApiAuthenticationExtension):
    target_class = "jobs.auth.AgentTokenAuthentication"
    name = "agentToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "Per-instance agent token (rsa_…)."}
