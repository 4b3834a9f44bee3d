"""The reads behind the dashboard's polled pages, in SQL.

Every open tab polls its page's JSON view every two seconds. On these small,
indexed reads Django's query building is most of the cost: building and compiling
a 25-row page query takes about ten times what the database needs to answer it.
So the polled reads are written here once, in SQL that PostgreSQL and SQLite both
run, with table names taken from the models. Writes, permissions and anything not
polled stay on the ORM.

A page's reads go together: `batch` sends them to PostgreSQL as one round trip (a
job page's six reads cost six round trips before, most of its server time); on
SQLite, in the same process, they simply run one after the other.

Each read gives plain values: datetimes timezone-aware (SQLite hands back naive
UTC ones), JSON columns decoded."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import User
from django.db import connection, models

from respawn_server.jobs.core.choices import InstanceState
from respawn_server.jobs.models import (Checkpoint, DiskPriceQuote, Drill, Instance, InterruptionEvent, Job, JobEvent, LogChunk,
                                       Membership, MetricPoint, PriceQuote, StepPoint, Team, WorldSize)
from respawn_server.jobs.money import costs
from respawn_server.jobs.money import downtime as money_downtime

JOB, INSTANCE, CHECKPOINT = Job._meta.db_table, Instance._meta.db_table, Checkpoint._meta.db_table
EVENT, INTERRUPTION, LOG = JobEvent._meta.db_table, InterruptionEvent._meta.db_table, LogChunk._meta.db_table
METRIC, TEAM, USER = MetricPoint._meta.db_table, Team._meta.db_table, User._meta.db_table
MEMBERSHIP, QUOTE, DISK_QUOTE = Membership._meta.db_table, PriceQuote._meta.db_table, DiskPriceQuote._meta.db_table
STEP, WORLD_SIZE, DRILL = StepPoint._meta.db_table, WorldSize._meta.db_table, Drill._meta.db_table
LIVE_STATES = tuple(sorted(InstanceState.LIVE))


def placeholders(values) -> str:
    return ", ".join(["%s"] * len(values))


@dataclass(frozen=True)
class Read:
    """One SELECT and what to make of its rows."""

    sql: str
    params: list = field(default_factory=list)
    shape: Callable[[list[tuple]], Any] = list

    def run(self):
        return batch(self)[0]


def _aware(value):
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value


def batch(*reads: Read) -> list:
    """Each read's shaped rows, in one round trip on PostgreSQL."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(";\n".join(read.sql for read in reads), [p for read in reads for p in read.params])
            found = [cursor.fetchall()]
            while cursor.nextset():
                found.append(cursor.fetchall())
        else:
            found = []
            for read in reads:
                cursor.execute(read.sql, read.params)
                found.append([tuple(_aware(value) for value in row) for row in cursor.fetchall()])
    return [read.shape(rows) for read, rows in zip(reads, found)]


def _named(*names: str) -> Callable[[list[tuple]], list[dict]]:
    return lambda rows: [dict(zip(names, row)) for row in rows]


# ---- the jobs list ----------------------------------------------------------------------------

def _like(text: str) -> str:
    """A LIKE pattern matching `text` anywhere, its own wildcards taken literally."""
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


LIST_COLUMNS = ("id", "name", "owner", "status", "status_reason", "last_step", "total_steps", "preemptions", "cloud")
MARK_COLUMNS = 3


def _with_money_keys(names: tuple[str, ...]) -> Callable[[list[tuple]], list[dict]]:
    """Rows whose last MARK_COLUMNS columns are `costs.settled_mark_columns`: those become
    the row's `money_key`."""
    def shape(rows):
        return [dict(zip(names, row[:-MARK_COLUMNS]), money_key=costs.settled_key(row[0], row[-MARK_COLUMNS:]))
                for row in rows]
    return shape


class JobList:
    """A team's jobs newest first, filtered, read a page at a time (Django's Paginator
    asks `count()` and slices; `load` reads the count and a page together first).

    Counting stops at `count_to`: a team's whole history is not counted on every
    poll, only as far as the pages around the one shown need; `capped` says the
    count is a lower bound."""

    def __init__(self, team_id: int, *, statuses=(), owner="", cloud="", search="", count_to: int):
        where, params = ["j.team_id = %s"], [team_id]
        if statuses:
            where.append(f"j.status IN ({placeholders(statuses)})")
            params.extend(statuses)
        if owner:
            where.append("u.username = %s")
            params.append(owner)
        if cloud:
            where.append(f"EXISTS (SELECT 1 FROM {INSTANCE} c WHERE c.job_id = j.id AND c.provider = %s)")
            params.append(cloud)
        if search:  # case-insensitive, as the ORM's icontains
            where.append("(UPPER(j.name) LIKE UPPER(%s) ESCAPE '\\' OR UPPER(u.username) LIKE UPPER(%s) ESCAPE '\\')")
            params.extend([_like(search)] * 2)
        self._where, self._params = " AND ".join(where), params
        self._owner_filtered = bool(owner or search)
        self._count, self._count_to, self._pages = None, count_to, {}

    def _count_read(self) -> Read:
        owners = f"JOIN {USER} u ON u.id = j.owner_id " if self._owner_filtered else ""
        return Read(f"SELECT COUNT(*) FROM (SELECT 1 FROM {JOB} j {owners}WHERE {self._where} LIMIT %s) t",
                    [*self._params, self._count_to], lambda rows: rows[0][0])

    def _page_read(self, offset: int, limit: int) -> Read:
        newest_cloud = (f"SELECT i.provider FROM {INSTANCE} i WHERE i.job_id = j.id "
                        "ORDER BY i.requested_at DESC, i.id DESC LIMIT 1")
        marks, marks_params = costs.settled_mark_columns("j")
        return Read(f"SELECT j.id, j.name, u.username, j.status, j.status_reason, j.last_step, j.total_steps, "
                    f"j.preemptions, ({newest_cloud}), {marks} FROM {JOB} j JOIN {USER} u ON u.id = j.owner_id "
                    f"WHERE {self._where} ORDER BY j.id DESC LIMIT %s OFFSET %s",
                    [*marks_params, *self._params, limit, offset], _with_money_keys(LIST_COLUMNS))

    def load(self, offset: int, limit: int, *also: Read) -> list:
        """Reads the count and the page at `offset` (and `also`) in one round trip; the
        answers of `also`."""
        self._count, page, *others = batch(self._count_read(), self._page_read(offset, limit), *also)
        self._pages[(offset, limit)] = page
        return others

    def count(self) -> int:
        if self._count is None:
            self._count = self._count_read().run()
        return self._count

    def __len__(self) -> int:
        return self.count()

    def __getitem__(self, page: slice) -> list[dict]:
        offset, limit = page.start, page.stop - page.start
        loaded = next((rows for (start, most), rows in self._pages.items() if start == offset and most >= limit), None)
        if loaded is None:  # the Paginator moved to another page, or asks the last one short
            loaded = self._pages[(offset, limit)] = self._page_read(offset, limit).run()
        return loaded[:limit]

    @property
    def capped(self) -> bool:
        return self.count() >= self._count_to


def team_usernames(team_id: int) -> Read:
    return Read(f"SELECT u.username FROM {MEMBERSHIP} m JOIN {USER} u ON u.id = m.user_id "
                "WHERE m.team_id = %s ORDER BY u.username", [team_id], lambda rows: [name for (name,) in rows])


# ---- one job ----------------------------------------------------------------------------------

JOB_COLUMNS = ("id", "team_id", "name", "status", "status_reason", "failure_cause", "failure_message", "last_step",
               "total_steps", "preemptions", "failure_restarts", "artifact_uri", "artifact_digest", "nodes", "nodes_min")


def _job_row(rows: list[tuple]) -> dict | None:
    if not rows:
        return None
    row = _with_money_keys((*JOB_COLUMNS, "team_name", "owner_username"))(rows)[0]
    # the page's template reads job.pk, job.team.name and job.owner.username, as of a model
    return row | {"pk": row["id"], "team": {"id": row["team_id"], "name": row["team_name"]},
                  "owner": {"username": row["owner_username"]}}


def job(pk: int) -> Read:
    """The job's row with its team's name, its owner's username and its `money_key`; None if none."""
    marks, marks_params = costs.settled_mark_columns("j")
    return Read(f"SELECT {', '.join('j.' + c for c in JOB_COLUMNS)}, t.name, u.username, {marks} "
                f"FROM {JOB} j JOIN {TEAM} t ON t.id = j.team_id JOIN {USER} u ON u.id = j.owner_id WHERE j.id = %s",
                [*marks_params, pk], _job_row)


INSTANCE_COLUMNS = ("id", "rank", "provider", "region", "zone", "instance_type", "market", "state", "end_reason",
                    "requested_at", "ended_at", "checkpoint_interval")


def _decoded_intervals(rows: list[tuple]) -> list[dict]:
    found = _named(*INSTANCE_COLUMNS)(rows)
    for row in found:
        if row["checkpoint_interval"] is not None:
            row["checkpoint_interval"] = json.loads(row["checkpoint_interval"])
    return found


def instances(job_id: int) -> Read:
    return Read(f"SELECT {', '.join(INSTANCE_COLUMNS)} FROM {INSTANCE} WHERE job_id = %s ORDER BY requested_at, id",
                [job_id], _decoded_intervals)


def checkpoint_interval(job_id: int) -> Read:
    """The checkpoint interval the job's newest instance that has one was given, and
    where that instance runs ({"interval", "where": market, zone, region}); None if none."""
    return Read(f"SELECT checkpoint_interval, market, zone, region FROM {INSTANCE} WHERE job_id = %s "
                "AND checkpoint_interval IS NOT NULL ORDER BY requested_at DESC, id DESC LIMIT 1", [job_id],
                lambda rows: {"interval": json.loads(rows[0][0]),
                              "where": dict(zip(("market", "zone", "region"), rows[0][1:]))} if rows else None)


def save_fit(job_id: int) -> Read:
    """The job's newest periodic save that says how long a notice save of its state
    would take and what notice its VM's cloud gives ({"persist_s", "notice_window_s",
    "provider"}); None if none does."""
    return Read(f"SELECT c.persist_s, c.notice_window_s, i.provider FROM {CHECKPOINT} c "
                f"JOIN {INSTANCE} i ON i.id = c.instance_id WHERE c.job_id = %s AND c.kind = 'periodic' "
                "AND c.persist_s IS NOT NULL AND c.notice_window_s IS NOT NULL "
                "ORDER BY c.committed_at DESC, c.id DESC LIMIT 1", [job_id],
                lambda rows: _named("persist_s", "notice_window_s", "provider")(rows)[0] if rows else None)


CHECKPOINT_COLUMNS = ("step", "kind", "committed_at", "tiers", "validation", "validation_message", "reference_loss",
                      "validation_loss", "bytes", "stall_s", "instance_id")


def _decoded_tiers(rows: list[tuple]) -> list[dict]:
    found = _named(*CHECKPOINT_COLUMNS)(rows)
    for row in found:
        row["tiers"] = json.loads(row["tiers"])
    return found


def newest_checkpoints(job_id: int, limit: int) -> Read:
    return Read(f"SELECT {', '.join(CHECKPOINT_COLUMNS)} FROM {CHECKPOINT} WHERE job_id = %s "
                "ORDER BY committed_at DESC, id DESC LIMIT %s", [job_id, limit], _decoded_tiers)


def interruptions(job_id: int) -> Read:
    return Read(f"SELECT e.kind, e.instance_id, e.notice_time, e.received_at, e.source FROM {INTERRUPTION} e "
                f"JOIN {INSTANCE} i ON i.id = e.instance_id WHERE i.job_id = %s ORDER BY e.received_at, e.id",
                [job_id], _named("kind", "instance_id", "notice_time", "received_at", "source"))


def loss_points(job_id: int, most: int) -> Read:
    """[step, loss, instance id] by instance (in launch order) and step: every step its
    trainer reported (StepPoint), or for an instance that reported none (an older agent,
    a trainer without the metrics file) its heartbeats' points. Every n-th point, n from
    the count, so a long run stays a bounded answer with its shape kept."""
    return Read(
        "SELECT step, loss, instance_id FROM (SELECT step, loss, instance_id, "
        "ROW_NUMBER() OVER (ORDER BY instance_id, step) AS n, COUNT(*) OVER () AS total FROM ("
        f"SELECT instance_id, step, loss FROM {STEP} WHERE job_id = %s AND loss IS NOT NULL UNION ALL "
        f"SELECT m.instance_id, m.step, m.loss FROM {METRIC} m WHERE m.job_id = %s AND m.loss IS NOT NULL "
        f"AND NOT EXISTS (SELECT 1 FROM {STEP} s WHERE s.instance_id = m.instance_id)) u) p "
        "WHERE n %% (CASE WHEN total < %s THEN 1 ELSE total / %s END) = 0 ORDER BY instance_id, step",
        [job_id, job_id, 2 * most, most], lambda rows: [list(row) for row in rows])


CURVE_INSTANCE_COLUMNS = ("id", "end_reason", "last_step", "resume_step", "resume_validation")


def curve_instances(job_id: int) -> Read:
    """What `respawn_server.frontend.story.loss_marks` marks on the loss curve, per instance in launch order."""
    return Read(f"SELECT i.id, i.end_reason, i.last_step, c.step, c.validation FROM {INSTANCE} i "
                f"LEFT JOIN {CHECKPOINT} c ON c.id = i.resume_checkpoint_id WHERE i.job_id = %s "
                "ORDER BY i.requested_at, i.id", [job_id], _named(*CURVE_INSTANCE_COLUMNS))


def log_chunks_after(job_id: int, after: int, limit: int) -> Read:
    """(chunk id, instance id, lines) of the job's log chunks past chunk `after`, in the
    order they arrived, at most `limit` of them: the job page reads its log from the
    first line on, a bounded answer at a time."""
    return Read(f"SELECT l.id, l.instance_id, l.lines FROM {LOG} l JOIN {INSTANCE} i ON i.id = l.instance_id "
                "WHERE i.job_id = %s AND l.id > %s ORDER BY l.id LIMIT %s", [job_id, after, limit],
                lambda rows: [(pk, instance_id, json.loads(lines)) for pk, instance_id, lines in rows])


def newest_events(job_id: int, limit: int) -> Read:
    return Read(f"SELECT created_at, from_status, to_status, message FROM {EVENT} WHERE job_id = %s "
                "ORDER BY created_at DESC, id DESC LIMIT %s", [job_id, limit],
                _named("created_at", "from_status", "to_status", "message"))


def tracked_job(pk: int) -> Read:
    """The job as `respawn_server.jobs.core.trackers.links` reads it: its pk, creation and env; None if none."""
    return Read(f"SELECT id, created_at, env FROM {JOB} WHERE id = %s", [pk],
                lambda rows: Job(pk=rows[0][0], created_at=rows[0][1], env=json.loads(rows[0][2])) if rows else None)


def latest_drill_id(job_id: int) -> Read:
    """The id of the job's newest drill; None if none."""
    return Read(f"SELECT id FROM {DRILL} WHERE job_id = %s ORDER BY requested_at DESC, id DESC LIMIT 1", [job_id],
                lambda rows: rows[0][0] if rows else None)


def downtime(job_id: int) -> list[Read]:
    """The rows `respawn_server.jobs.money.downtime.job_downtime` reads, to go in a page's round trip."""
    return [Read(sql, params) for sql, params in money_downtime.reads(job_id)]


def world_sizes(job_id: int) -> Read:
    """The job's world size over time (respawn_server.jobs.models.WorldSize), oldest first."""
    return Read(f"SELECT w.at, w.world_size, w.reason, COALESCE(w.memory_resume_step, c.step), w.memory_resume_step IS NOT NULL, "
                f"w.after_instance_id IS NOT NULL FROM {WORLD_SIZE} w LEFT JOIN {CHECKPOINT} c ON c.id = w.resume_checkpoint_id "
                "WHERE w.job_id = %s ORDER BY w.at, w.id", [job_id],
                _named("at", "world_size", "reason", "resume_step", "from_memory", "regroup"))


# ---- a team -----------------------------------------------------------------------------------

def team_names(team_ids) -> Read:
    """(id, name) of these teams, by name."""
    if not team_ids:
        return Read(f"SELECT id, name FROM {TEAM} WHERE 1 = 0")
    return Read(f"SELECT id, name FROM {TEAM} WHERE id IN ({placeholders(team_ids)}) ORDER BY name", list(team_ids))


def _team(rows: list[tuple]) -> Team | None:
    if not rows:
        return None
    values = list(rows[0])
    for i, field in enumerate(TEAM_FIELDS):
        if isinstance(field, models.DecimalField) and values[i] is not None:
            # SQLite keeps a decimal column as a number: back to the field's places, as the ORM reads it
            values[i] = Decimal(str(values[i])).quantize(Decimal(1).scaleb(-field.decimal_places))
    return Team.from_db(connection.alias, [field.attname for field in TEAM_FIELDS], values)


TEAM_FIELDS = Team._meta.concrete_fields


def team(pk: int) -> Read:
    """The team, a whole model instance; None if none."""
    return Read(f"SELECT {', '.join(field.column for field in TEAM_FIELDS)} FROM {TEAM} WHERE id = %s", [pk], _team)


def jobs_by_status(team_id: int, statuses) -> Read:
    statuses = sorted(statuses)
    return Read(f"SELECT status, COUNT(*) FROM {JOB} WHERE team_id = %s AND status IN ({placeholders(statuses)}) "
                "GROUP BY status", [team_id, *statuses], dict)


def live_instances(team_id: int) -> Read:
    """(instance id, job id) of the team's live instances."""
    return Read(f"SELECT i.id, i.job_id FROM {INSTANCE} i JOIN {JOB} j ON j.id = i.job_id "
                f"WHERE j.team_id = %s AND i.state IN ({placeholders(LIVE_STATES)})", [team_id, *LIVE_STATES])


def newest_ids() -> Read:
    """The newest instance, checkpoint, interruption, price quote and disk price quote anywhere."""
    return Read(f"SELECT (SELECT MAX(id) FROM {INSTANCE}), (SELECT MAX(id) FROM {CHECKPOINT}), "
                f"(SELECT MAX(id) FROM {INTERRUPTION}), (SELECT MAX(id) FROM {QUOTE}), "
                f"(SELECT MAX(id) FROM {DISK_QUOTE})", [], lambda rows: rows[0])
