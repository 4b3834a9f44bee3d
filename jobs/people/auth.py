"""Bearer-token authentication for people (personal API tokens) and agents
(per-instance agent tokens). Both look tokens up by their SHA-256 digest."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone
from rest_framework import authentication, exceptions

from respawn_server.jobs.core.choices import InstanceState
from respawn_server.jobs.fleet.heartbeats import heartbeat_lookup
from respawn_server.jobs.models import ApiToken, Instance
from respawn_server.jobs.people.tokens import hash_token

# Writing last_used_at on every request would turn reads into writes.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def bearer_token(request) -> str | None:
    header = authentication.get_authorization_header(request).decode("latin-1")
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() not in ("bearer", "token") or not token.strip():
        raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <token>'.")
    return token.strip()


class HashedTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request):
        token = bearer_token(request)
        if token is None:
            return None
        api_token = ApiToken.objects.select_related("user").filter(key_hash=hash_token(token)).first()
        now = timezone.now()
        if api_token is None or api_token.revoked_at is not None:
            raise exceptions.AuthenticationFailed("Invalid token.")
        if api_token.expires_at is not None and api_token.expires_at <= now:
            raise exceptions.AuthenticationFailed("Token expired.")
        if not api_token.user.is_active:
            raise exceptions.AuthenticationFailed("User inactive.")
        if api_token.last_used_at is None or now - api_token.last_used_at > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=api_token.pk).update(last_used_at=now)
        return api_token.user, api_token

    def authenticate_header(self, request):
        return "Bearer"


class AgentPrincipal:
    """request.user for agent calls: the instance, not a person."""

    is_authenticated = True
    is_active = True
    is_staff = False
    is_superuser = False

    def __init__(self, instance: Instance):
        self.instance = instance


class AgentTokenAuthentication(authentication.BaseAuthentication):
    """An agent token opens only its own instance, and only while the instance is
    live or within the grace window after it ended, so a fenced VM can still
    deliver checkpoints, logs and its exit report."""

    def authenticate(self, request):
        instance = self.admit(self.find_instance(agent_token_digest(request)))
        return AgentPrincipal(instance), instance

    def find_instance(self, digest: str) -> Instance | None:
        return Instance.objects.select_related("job").filter(agent_token_hash=digest).first()

    @staticmethod
    def admit(instance: Instance | None) -> Instance:
        """The instance a token found, if that token still opens it; else 401."""
        if instance is None:
            raise exceptions.AuthenticationFailed("Invalid agent token.")
        if instance.state == InstanceState.ENDED:
            grace = timedelta(seconds=settings.RESPAWN["FENCE_GRACE_S"])
            if instance.ended_at is None or timezone.now() - instance.ended_at > grace:
                raise exceptions.AuthenticationFailed("Agent token revoked: the instance ended.")
        return instance

    def authenticate_header(self, request):
        return "Bearer"


class BootstrapTokenAuthentication(authentication.BaseAuthentication):
    """A VM's bootstrap token, only until its agent registers with it: what the boot
    script holds while it installs the agent (respawn_server.jobs.fleet.providers.base.AGENT_INSTALLER)."""

    def authenticate(self, request):
        instance = Instance.objects.select_related("job").filter(
            bootstrap_token_hash=agent_token_digest(request), register_event_id__isnull=True,
            state__in=InstanceState.LIVE).first()
        if instance is None:
            raise exceptions.AuthenticationFailed("Invalid, used or expired bootstrap token.")
        return AgentPrincipal(instance), instance

    def authenticate_header(self, request):
        return "Bearer"


class BootstrapOrAgentTokenAuthentication(AgentTokenAuthentication):
    """Either token of a VM: the boot script's before register, the agent's after."""

    def authenticate(self, request):
        try:
            return BootstrapTokenAuthentication().authenticate(request)
        except exceptions.AuthenticationFailed:
            return super().authenticate(request)


def agent_token_digest(request) -> str:
    token = bearer_token(request)
    if token is None:
        raise exceptions.NotAuthenticated("Agent token required.")
    return hash_token(token)


class HeartbeatTokenAuthentication(AgentTokenAuthentication):
    """The same check, loading only what a heartbeat reads of the instance and its job
    (respawn_server.jobs.fleet.heartbeats.HeartbeatLookup). The heartbeat itself folds this lookup into the
    statement that applies it (respawn_server.jobs.fleet.heartbeats.record_heartbeat); this class serves its 401s."""

    def find_instance(self, digest: str) -> Instance | None:
        return heartbeat_lookup().find(digest)
