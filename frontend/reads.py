"""The reads behind the dashboard's polled pages, in SQL.

Every open tab polls its page's JSON view every two seconds. On these small,
indexed reads Django's query building is most of the cost: building and compiling
a 25-row page query takes about ten times what the database needs to answer it,
and a job page makes eight such reads. So the polled reads are written here once,
in SQL that PostgreSQL and SQLite both run, with table names taken from the
models. Writes, permissions and anything not polled stay on the ORM.

Each read returns plain values: datetimes timezone-aware (SQLite hands back naive
UTC ones), JSON columns decoded."""

from __future__ import annotations

import datetime as dt
import json

from django.contrib.auth.models import User
from django.db import connection

from jobs import costs
from jobs.choices import InstanceState
from jobs.models import (Checkpoint, Instance, InterruptionEvent, Job, JobEvent, LogChunk, Membership, MetricPoint,
                         Team)

JOB, INSTANCE, CHECKPOINT = Job._meta.db_table, Instance._meta.db_table, Checkpoint._meta.db_table
EVENT, INTERRUPTION, LOG = JobEvent._meta.db_table, InterruptionEvent._meta.db_table, LogChunk._meta.db_table
METRIC, TEAM, USER = MetricPoint._meta.db_table, Team._meta.db_table, User._meta.db_table
LIVE_STATES = tuple(sorted(InstanceState.LIVE))


def placeholders(values) -> str:
    return ", ".join(["%s"] * len(values))


def _aware(value):
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value


def rows(sql: str, params=()) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchall()
    if connection.vendor == "sqlite":
        return [tuple(_aware(value) for value in row) for row in found]
    return found


def dicts(sql: str, params, names: tuple[str, ...]) -> list[dict]:
    return [dict(zip(names, row)) for row in rows(sql, params)]


# ---- the jobs list ----------------------------------------------------------------------------

def _like(text: str) -> str:
    """A LIKE pattern matching `text` anywhere, its own wildcards taken literally."""
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


LIST_COLUMNS = ("id", "name", "owner", "status", "status_reason", "last_step", "total_steps", "preemptions", "cloud")
MARK_COLUMNS = 3


def _with_marks(found: list[tuple], names: tuple[str, ...]) -> list[dict]:
    """Rows whose last MARK_COLUMNS columns are `costs.settled_mark_columns`: those become
    the row's `money_key`."""
    return [dict(zip(names, row[:-MARK_COLUMNS]), money_key=costs.settled_key(row[0], row[-MARK_COLUMNS:]))
            for row in found]


class JobList:
    """A team's jobs newest first, filtered, read a page at a time (Django's Paginator
    asks `count()` and slices).

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
        self._count, self._count_to = None, count_to

    def count(self) -> int:
        if self._count is None:
            owners = f"JOIN {USER} u ON u.id = j.owner_id " if self._owner_filtered else ""
            self._count = rows(f"SELECT COUNT(*) FROM (SELECT 1 FROM {JOB} j {owners}WHERE {self._where} LIMIT %s) t",
                               [*self._params, self._count_to])[0][0]
        return self._count

    @property
    def capped(self) -> bool:
        return self.count() >= self._count_to

    def __len__(self) -> int:
        return self.count()

    def __getitem__(self, page: slice) -> list[dict]:
        newest_cloud = (f"SELECT i.provider FROM {INSTANCE} i WHERE i.job_id = j.id "
                        "ORDER BY i.requested_at DESC, i.id DESC LIMIT 1")
        marks, marks_params = costs.settled_mark_columns("j")
        sql = (f"SELECT j.id, j.name, u.username, j.status, j.status_reason, j.last_step, j.total_steps, "
               f"j.preemptions, ({newest_cloud}), {marks} FROM {JOB} j JOIN {USER} u ON u.id = j.owner_id "
               f"WHERE {self._where} ORDER BY j.id DESC LIMIT %s OFFSET %s")
        return _with_marks(rows(sql, [*marks_params, *self._params, page.stop - page.start, page.start]),
                           LIST_COLUMNS)


def team_usernames(team_id: int) -> list[str]:
    return [name for (name,) in rows(
        f"SELECT u.username FROM {Membership._meta.db_table} m JOIN {USER} u ON u.id = m.user_id "
        "WHERE m.team_id = %s ORDER BY u.username", [team_id])]


# ---- one job ----------------------------------------------------------------------------------

JOB_COLUMNS = ("id", "team_id", "name", "status", "status_reason", "failure_cause", "last_step", "total_steps",
               "preemptions", "failure_restarts", "artifact_uri", "artifact_digest")


def job(pk: int) -> dict | None:
    """The job's row with its team's name, its owner's username and its `money_key`."""
    marks, marks_params = costs.settled_mark_columns("j")
    found = _with_marks(rows(f"SELECT {', '.join('j.' + c for c in JOB_COLUMNS)}, t.name, u.username, {marks} "
                             f"FROM {JOB} j JOIN {TEAM} t ON t.id = j.team_id JOIN {USER} u ON u.id = j.owner_id "
                             "WHERE j.id = %s", [*marks_params, pk]), (*JOB_COLUMNS, "team_name", "owner_username"))
    if not found:
        return None
    row = found[0]
    # the page's template reads job.pk, job.team.name and job.owner.username, as of a model
    return row | {"pk": row["id"], "team": {"id": row["team_id"], "name": row["team_name"]},
                  "owner": {"username": row["owner_username"]}}


INSTANCE_COLUMNS = ("id", "rank", "provider", "region", "zone", "instance_type", "market", "state", "end_reason",
                    "requested_at", "ended_at", "checkpoint_interval")


def instances(job_id: int) -> list[dict]:
    found = dicts(f"SELECT {', '.join(INSTANCE_COLUMNS)} FROM {INSTANCE} WHERE job_id = %s ORDER BY requested_at, id",
                  [job_id], INSTANCE_COLUMNS)
    for row in found:
        if row["checkpoint_interval"] is not None:
            row["checkpoint_interval"] = json.loads(row["checkpoint_interval"])
    return found


def checkpoint_interval(job_id: int) -> dict | None:
    """The checkpoint interval the job's newest instance that has one was given."""
    found = rows(f"SELECT checkpoint_interval FROM {INSTANCE} WHERE job_id = %s AND checkpoint_interval IS NOT NULL "
                 "ORDER BY requested_at DESC, id DESC LIMIT 1", [job_id])
    return json.loads(found[0][0]) if found else None


CHECKPOINT_COLUMNS = ("step", "kind", "committed_at", "validation", "reference_loss", "validation_loss", "bytes",
                      "stall_s", "instance_id")


def newest_checkpoints(job_id: int, limit: int) -> list[dict]:
    return dicts(f"SELECT {', '.join(CHECKPOINT_COLUMNS)} FROM {CHECKPOINT} WHERE job_id = %s "
                 "ORDER BY committed_at DESC, id DESC LIMIT %s", [job_id, limit], CHECKPOINT_COLUMNS)


def interruptions(job_id: int) -> list[dict]:
    return dicts(f"SELECT e.kind, e.instance_id, e.notice_time, e.received_at, e.source FROM {INTERRUPTION} e "
                 f"JOIN {INSTANCE} i ON i.id = e.instance_id WHERE i.job_id = %s ORDER BY e.received_at, e.id",
                 [job_id], ("kind", "instance_id", "notice_time", "received_at", "source"))


def loss_points(job_id: int, most: int) -> list[tuple]:
    """(step, loss) in time order: every n-th point, n from the count, so a long run
    stays a bounded answer with its shape kept."""
    return rows(
        "SELECT step, loss FROM (SELECT step, loss, time, id, ROW_NUMBER() OVER (ORDER BY time, id) AS n, "
        f"COUNT(*) OVER () AS total FROM {METRIC} WHERE job_id = %s AND loss IS NOT NULL) p "
        "WHERE n %% (CASE WHEN total < %s THEN 1 ELSE total / %s END) = 0 ORDER BY time, id",
        [job_id, 2 * most, most])


def newest_log_chunks(job_id: int, limit: int) -> list[tuple[int, list[str]]]:
    return [(instance_id, json.loads(lines)) for instance_id, lines in rows(
        f"SELECT l.instance_id, l.lines FROM {LOG} l JOIN {INSTANCE} i ON i.id = l.instance_id "
        "WHERE i.job_id = %s ORDER BY l.created_at DESC, l.id DESC LIMIT %s", [job_id, limit])]


def newest_events(job_id: int, limit: int) -> list[dict]:
    return dicts(f"SELECT created_at, from_status, to_status, message FROM {EVENT} WHERE job_id = %s "
                 "ORDER BY created_at DESC, id DESC LIMIT %s", [job_id, limit],
                 ("created_at", "from_status", "to_status", "message"))


# ---- a team -----------------------------------------------------------------------------------

def team_names(team_ids) -> list[tuple[int, str]]:
    """(id, name) of these teams, by name."""
    if not team_ids:
        return []
    return rows(f"SELECT id, name FROM {TEAM} WHERE id IN ({placeholders(team_ids)}) ORDER BY name", list(team_ids))


def jobs_by_status(team_id: int, statuses) -> dict[str, int]:
    statuses = sorted(statuses)
    return dict(rows(f"SELECT status, COUNT(*) FROM {JOB} WHERE team_id = %s AND status IN "
                     f"({placeholders(statuses)}) GROUP BY status", [team_id, *statuses]))


def live_instances(team_id: int) -> list[tuple[int, int]]:
    """(instance id, job id) of the team's live instances."""
    return rows(f"SELECT i.id, i.job_id FROM {INSTANCE} i JOIN {JOB} j ON j.id = i.job_id "
                f"WHERE j.team_id = %s AND i.state IN ({placeholders(LIVE_STATES)})", [team_id, *LIVE_STATES])
