"""The heartbeat, the hot path of the whole API (DESIGN §5): every agent, every few
seconds. Its token lookup reads only what the answer needs, and on PostgreSQL the
lookup and every write are one statement (one round trip, one short transaction)."""

from __future__ import annotations

import functools
import threading

import psycopg
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, connections, transaction
from django.db.models import Subquery
from django.db.models.functions import Greatest
from django.utils import timezone

from respawn_server.jobs.core import services
from respawn_server.jobs.core.choices import InstanceState
from respawn_server.jobs.models import Instance, Job, MetricPoint, ProcessedEvent


def record_heartbeat(token_digest: str, *, event_id, step: int, loss, samples_per_s) -> Instance | None:
    """The instance of an agent token, as it was before this heartbeat (with its job's
    status: see HeartbeatLookup), or None for an unknown token. If the instance is live,
    its heartbeat is applied once per `event_id`: the event row, the instance's progress
    and deadline, the job's step and a metric point, all or nothing. Whether the token
    still opens the instance is the caller's to judge (an ended instance gets no writes).

    The hot path of the whole API. On PostgreSQL the lookup and the writes are one
    statement, one round trip in its own transaction; elsewhere the lookup and then the
    writes through the ORM."""
    now = timezone.now()
    deadline = now + services.heartbeat_timeout()
    lookup = heartbeat_lookup()
    db = connections[DEFAULT_DB_ALIAS]  # the proxy `connection` costs a thread-local lookup per attribute
    if db.vendor == "postgresql":
        row = _run_statement(db, {"digest": token_digest, "event_id": event_id, "now": now, "deadline": deadline,
                                  "step": step, "loss": loss, "samples_per_s": samples_per_s})
        return lookup.load(row, db)
    instance = lookup.find(token_digest)
    if instance is not None and instance.state in InstanceState.LIVE:
        _apply_heartbeat(instance, event_id, now, deadline, step=step, loss=loss, samples_per_s=samples_per_s)
    return instance


@transaction.atomic
def _apply_heartbeat(instance: Instance, event_id, now, deadline, *, step: int, loss, samples_per_s) -> None:
    """record_heartbeat's writes through the ORM (every database but PostgreSQL)."""
    try:
        with transaction.atomic():
            ProcessedEvent.objects.create(event_id=event_id, instance_id=instance.pk, kind="heartbeat")
    except IntegrityError:
        return  # a resend
    if not Instance.objects.filter(pk=instance.pk, state__in=InstanceState.LIVE).update(
            last_step=Greatest("last_step", step), last_heartbeat_at=now, heartbeat_deadline=deadline):
        return  # it ended meanwhile: a fenced VM's progress is not the job's
    # The instance's step, not this report's: a reordered older heartbeat never moves the job back.
    Job.objects.filter(pk=instance.job_id).update(
        last_step=Subquery(Instance.objects.filter(pk=instance.pk).values("last_step")[:1]))
    MetricPoint.objects.create(job_id=instance.job_id, instance=instance, time=now, step=step, loss=loss,
                               samples_per_s=samples_per_s)


class _PreparingCursor(psycopg.Cursor):
    """Binds parameters server-side and prepares each statement on its first use in a session."""

    def execute(self, query, params=None, **kwargs):
        return super().execute(query, params, **{**kwargs, "prepare": True})


def _run_statement(db, params: dict):
    """_heartbeat_sql's row, run through Django's cursor wrapper (query log, execute
    wrappers, error translation) around a psycopg cursor that prepares it. Parsing and
    planning the statement cost PostgreSQL about as much CPU as running it; prepared,
    the generic plan serves every heartbeat of the connection. The psycopg cursor is
    kept per connection: a new one looks up its parameters' dumpers afresh, a third of
    the statement's cost on our side.

    Django turns psycopg's prepared statements off unless OPTIONS sets prepare_threshold,
    for connection poolers that cannot keep them (PgBouncer in transaction mode before
    1.21, or without max_prepared_statements). An OPTIONS prepare_threshold of None is
    taken as that word: no preparing. Without the option, only this statement is
    prepared: the connection's threshold is raised from off to never-by-count, which
    changes no other query (Django's own cursors bind client-side and never prepare)."""
    options = db.settings_dict["OPTIONS"]
    if "prepare_threshold" in options and options["prepare_threshold"] is None:
        with db.cursor() as cursor:
            cursor.execute(_heartbeat_sql(), params)
            return cursor.fetchone()
    db.close_if_health_check_failed()  # what Django's cursor() does before handing one out
    db.ensure_connection()
    db.validate_thread_sharing()
    raw = db.connection
    kept = getattr(_kept, "cursor", None)
    if kept is None or kept.connection is not raw:
        if raw.prepare_threshold is None:
            raw.prepare_threshold = ONLY_WHEN_ASKED
        with db.wrap_database_errors:
            kept = _kept.cursor = _PreparingCursor(raw)
    cursor = db.make_debug_cursor(kept) if db.queries_logged else db.make_cursor(kept)
    cursor.execute(_heartbeat_sql(), params)
    return cursor.fetchone()


_kept = threading.local()  # .cursor: the heartbeat cursor of this thread's connection (Django's are per thread)

ONLY_WHEN_ASKED = 2**31 - 1  # a psycopg prepare_threshold no query reaches by being run often


@functools.cache
def _heartbeat_sql() -> str:
    """record_heartbeat as one PostgreSQL statement, its writes as _apply_heartbeat's.
    The event insert gates the rest: for an unknown token or an instance that is not
    live it has no row to insert, and on a resend ON CONFLICT inserts nothing, so no
    row reaches the updates. Two concurrent resends: the second insert waits for the
    first transaction and then conflicts (or inserts, had the first rolled back), so
    exactly one applies. An instance ended after the statement's snapshot fails the
    update's state check, which PostgreSQL re-evaluates on the newest row. Rows are
    locked in the ORM path's order: the instance, then its job. The answer is the
    lookup's row, as of before the writes."""
    q = connection.ops.quote_name
    event, instance, job, metric = (q(m._meta.db_table) for m in (ProcessedEvent, Instance, Job, MetricPoint))
    lookup = heartbeat_lookup()
    assert all(state.isidentifier() for state in InstanceState.LIVE)  # spelled into the SQL below
    live = ", ".join(f"'{state}'" for state in sorted(InstanceState.LIVE))
    return f"""
        WITH agent AS ({lookup.sql}),
        event AS (
            INSERT INTO {event} (event_id, instance_id, kind, received_at)
            SELECT %(event_id)s::uuid, {lookup.column["id"]}, 'heartbeat', %(now)s::timestamptz
            FROM agent WHERE {lookup.column["state"]} IN ({live})
            ON CONFLICT (instance_id, event_id) DO NOTHING
            RETURNING instance_id
        ), beat AS (
            UPDATE {instance}
            SET last_step = GREATEST(last_step, %(step)s::bigint), last_heartbeat_at = %(now)s::timestamptz,
                heartbeat_deadline = %(deadline)s::timestamptz
            WHERE id = (SELECT instance_id FROM event) AND state IN ({live})
            RETURNING id, job_id, last_step
        ), progress AS (
            UPDATE {job} SET last_step = beat.last_step FROM beat WHERE {job}.id = beat.job_id
        ), point AS (
            INSERT INTO {metric} (job_id, instance_id, time, step, loss, samples_per_s)
            SELECT job_id, id, %(now)s::timestamptz, %(step)s::bigint, %(loss)s::double precision,
                   %(samples_per_s)s::double precision
            FROM beat
        )
        SELECT * FROM agent"""


class HeartbeatLookup:
    """An agent's instance and job by token digest: one indexed query for the few
    columns a heartbeat reads, built once from the models' metadata. Compiling the
    ORM's query for a whole instance and job took a millisecond of CPU, more than the
    rest of a heartbeat. A field the heartbeat starts reading must be added here, else
    it costs a query of its own (the heartbeat's pinned query count says so).

    `sql` takes the digest as %(digest)s and names its columns c0, c1, ...;
    `column` maps an instance field to its name there."""

    INSTANCE_FIELDS = frozenset({"id", "job_id", "state", "ended_at", "requested_action", "checkpoint_interval",
                                 "gang_generation", "memory_resume_step"})
    JOB_FIELDS = frozenset({"id", "status", "checkpoint_interval_s"})

    def __init__(self):
        q = connection.ops.quote_name
        self.instance_fields = [f for f in Instance._meta.concrete_fields if f.attname in self.INSTANCE_FIELDS]
        self.job_fields = [f for f in Job._meta.concrete_fields if f.attname in self.JOB_FIELDS]
        selected = [f"i.{q(f.column)}" for f in self.instance_fields] + [f"j.{q(f.column)}" for f in self.job_fields]
        self.instance_attnames = [f.attname for f in self.instance_fields]
        self.job_attnames = [f.attname for f in self.job_fields]
        self.column = {f.attname: f"c{n}" for n, f in enumerate(self.instance_fields)}
        self._local = threading.local()
        self.sql = (
            f"SELECT {', '.join(f'{c} AS c{n}' for n, c in enumerate(selected))} "
            f"FROM {q(Instance._meta.db_table)} i JOIN {q(Job._meta.db_table)} j "
            f"ON j.{q(Job._meta.pk.column)} = i.{q(Instance.job.field.column)} "
            f"WHERE i.{q(Instance._meta.get_field('agent_token_hash').column)} = %(digest)s")

    def find(self, digest: str) -> Instance | None:
        db = connections[DEFAULT_DB_ALIAS]
        with db.cursor() as cursor:
            cursor.execute(self.sql, {"digest": digest})
            return self.load(cursor.fetchone(), db)

    def load(self, row, db) -> Instance | None:
        """The instance (and its job) of a row of `sql`'s columns, its values converted
        as the ORM would (JSON, SQLite's datetimes), the other fields deferred."""
        if row is None:
            return None
        values = list(row)
        for n, column, converters in self._converters(db):
            for convert in converters:
                values[n] = convert(values[n], column, db)
        split = len(self.instance_fields)
        instance = Instance.from_db(db.alias, self.instance_attnames, values[:split])
        instance.job = Job.from_db(db.alias, self.job_attnames, values[split:])
        return instance

    def _converters(self, db) -> list:
        """(column index, column, converters) for each column that has converters on `db`
        (kept per thread: Django's connections are, and their converters are bound to them)."""
        known = getattr(self._local, "converters", None)
        if known is None or known[0] is not db:
            found = []
            selected = [(Instance, f) for f in self.instance_fields] + [(Job, f) for f in self.job_fields]
            for n, (model, field) in enumerate(selected):
                column = field.get_col(model._meta.db_table)
                if converters := db.ops.get_db_converters(column) + column.get_db_converters(db):
                    found.append((n, column, converters))
            known = self._local.converters = (db, found)
        return known[1]


@functools.cache
def heartbeat_lookup() -> HeartbeatLookup:
    return HeartbeatLookup()
