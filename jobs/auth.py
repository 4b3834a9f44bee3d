"""Bearer-token authentication for people (personal API tokens) and agents
(per-instance agent tokens). Both look tokens up by their SHA-256 digest."""

from __future__ import annotations

import functools
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone
from rest_framework import authentication, exceptions

from jobs.choices import InstanceState
from jobs.models import ApiToken, Instance, Job
from jobs.tokens import hash_token

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
        token = bearer_token(request)
        if token is None:
            raise exceptions.NotAuthenticated("Agent token required.")
        instance = self.find_instance(hash_token(token))
        if instance is None:
            raise exceptions.AuthenticationFailed("Invalid agent token.")
        if instance.state == InstanceState.ENDED:
            grace = timedelta(seconds=settings.RESPAWN["FENCE_GRACE_S"])
            if instance.ended_at is None or timezone.now() - instance.ended_at > grace:
                raise exceptions.AuthenticationFailed("Agent token revoked: the instance ended.")
        return AgentPrincipal(instance), instance

    def find_instance(self, digest: str) -> Instance | None:
        return Instance.objects.select_related("job").filter(agent_token_hash=digest).first()

    def authenticate_header(self, request):
        return "Bearer"


class HeartbeatTokenAuthentication(AgentTokenAuthentication):
    """The same check, loading only what a heartbeat reads of the instance and its job.

    Compiling the ORM's query for a whole instance and job took a millisecond of
    CPU, more than the rest of a heartbeat; this statement is built once from the
    models' metadata. A field the heartbeat starts reading must be added here, else
    it costs a query of its own (the heartbeat's pinned query count says so)."""

    INSTANCE_FIELDS = frozenset({"id", "job_id", "state", "ended_at", "requested_action", "checkpoint_interval"})
    JOB_FIELDS = frozenset({"id", "status", "checkpoint_interval_s"})

    def find_instance(self, digest: str) -> Instance | None:
        sql, instance_fields, job_fields = self.lookup()
        with connection.cursor() as cursor:
            cursor.execute(sql, [digest])
            row = cursor.fetchone()
        if row is None:
            return None
        instance = load_narrow(Instance, instance_fields, row[:len(instance_fields)])
        instance.job = load_narrow(Job, job_fields, row[len(instance_fields):])
        return instance

    @classmethod
    @functools.cache
    def lookup(cls) -> tuple[str, list, list]:
        instance_fields, job_fields = narrow_fields(Instance, cls.INSTANCE_FIELDS), narrow_fields(Job, cls.JOB_FIELDS)
        q = connection.ops.quote_name
        columns = [f"i.{q(f.column)}" for f in instance_fields] + [f"j.{q(f.column)}" for f in job_fields]
        sql = (f"SELECT {', '.join(columns)} FROM {q(Instance._meta.db_table)} i "
               f"JOIN {q(Job._meta.db_table)} j ON j.{q(Job._meta.pk.column)} = i.{q(Instance.job.field.column)} "
               f"WHERE i.{q(Instance._meta.get_field('agent_token_hash').column)} = %s")
        return sql, instance_fields, job_fields


def narrow_fields(model, attnames) -> list:
    """`attnames` of `model` as fields, in the model's order (the order `from_db` expects)."""
    return [f for f in model._meta.concrete_fields if f.attname in attnames]


def load_narrow(model, fields, values):
    """A model instance from raw column values, converted as the ORM would (JSON, SQLite's datetimes);
    the fields not loaded are deferred."""
    converted = []
    for field, value in zip(fields, values):
        column = field.get_col(model._meta.db_table)
        for convert in connection.ops.get_db_converters(column) + column.get_db_converters(connection):
            value = convert(value, column, connection)
        converted.append(value)
    return model.from_db(connection.alias, [f.attname for f in fields], converted)
