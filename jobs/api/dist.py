"""What a VM's boot script asks of the agent API before any agent of ours runs there
(DESIGN §11): the agent's wheel and its pinned requirements (respawn_server.jobs.fleet.agent_dist),
and, when it cannot install them, a word that the VM's setup failed."""

from __future__ import annotations

from django.http import FileResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, serializers

from respawn_server.jobs.api.agent import AckSerializer, AgentView, ReportSerializer, ack, apply_once
from respawn_server.jobs.fleet import agent_dist
from respawn_server.jobs.people.auth import BootstrapOrAgentTokenAuthentication, BootstrapTokenAuthentication
from respawn_server.jobs.reports.registration import agent_setup_failed


class DistView(AgentView):
    """A wheel or requirements file of the agent, by the name the user data pins
    (`respawn-agent-<sha256>.whl` or `.requirements.txt`), to a live VM's bootstrap
    token before its agent registers, or to its agent token. The VM checks the bytes
    against the SHA-256 in the name; nothing else of the dist directory is served."""

    authentication_classes = [BootstrapOrAgentTokenAuthentication]

    @extend_schema(responses={(200, "application/octet-stream"): OpenApiTypes.BINARY, 404: None})
    def get(self, request, name: str):
        path = agent_dist.served_file(name)
        if path is None:
            raise exceptions.NotFound(f"No agent file named {name!r} on this control plane.")
        return FileResponse(open(path, "rb"), content_type="application/octet-stream")


class SetupFailedSerializer(ReportSerializer):
    message = serializers.CharField(max_length=500)


class SetupFailedView(AgentView):
    """The boot script could not install the agent (a wheel or requirements file whose
    SHA-256 is not the pinned one, a download or pip install that failed). Only the
    bootstrap token of a VM whose agent never registered says so: an agent that runs
    reports its own setup failures in its exit. The job fails with cause `setup`
    (reports.registration.agent_setup_failed) and its VMs are terminated: no retry keeps billing."""

    authentication_classes = [BootstrapTokenAuthentication]
    body_serializer = SetupFailedSerializer

    @extend_schema(request=SetupFailedSerializer, responses=AckSerializer)
    def post(self, request):
        data = self.validated(request)
        applied = apply_once(self.instance, data["event_id"], "setup-failed",
                             lambda: agent_setup_failed(self.instance, data["message"]))
        return ack(duplicate=not applied)
