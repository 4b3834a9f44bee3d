"""The only place a job's status or an instance's state changes.

Each change is a guarded UPDATE (the expected old state in the WHERE) plus an
event row in the same transaction. A zero-row update means another process got
there first: a lost race, reported as False, not an error. A change the table
of DESIGN §4 does not allow is a programming error and raises.
"""

from __future__ import annotations

from django.db import connection, transaction
from django.utils import timezone

from respawn_server.jobs.core.choices import InstanceState, JobStatus
from respawn_server.jobs.core.signals import job_status_changed
from respawn_server.jobs.models import Instance, InstanceEvent, Job, JobEvent


class IllegalTransition(Exception):
    pass


def _check(table: dict[str, frozenset[str]], machine: str, old: str, new: str) -> None:
    if new not in table.get(old, frozenset()):
        raise IllegalTransition(f"{machine}: {old} -> {new} is not in the transition table")


def transition_job(job_id: int, old: str, new: str, *, message: str = "", **fields) -> bool:
    _check(JobStatus.TRANSITIONS, "job", old, new)
    if new in JobStatus.TERMINAL:
        fields.setdefault("finished_at", timezone.now())
    if message and "status_reason" not in fields:
        fields["status_reason"] = message
    with transaction.atomic():
        updated = Job.objects.filter(pk=job_id, status=old).update(status=new, updated_at=timezone.now(), **fields)
        if updated:
            JobEvent.objects.create(job_id=job_id, from_status=old, to_status=new, message=message)
            job_status_changed.send(sender=Job, job_id=job_id, old=old, new=new, fields=fields)
    return bool(updated)


def transition_instance(instance_id: int, old: str, new: str, *, message: str = "", **fields) -> bool:
    _check(InstanceState.TRANSITIONS, "instance", old, new)
    if new == InstanceState.ENDED:
        if not fields.get("end_reason"):
            raise IllegalTransition("instance: ending needs an end_reason")
        fields.setdefault("ended_at", timezone.now())
    with transaction.atomic():
        updated = Instance.objects.filter(pk=instance_id, state=old).update(state=new, **fields)
        if updated:
            InstanceEvent.objects.create(instance_id=instance_id, from_state=old, to_state=new, message=message[:500])
    return bool(updated)


# The first key of PostgreSQL's two-key advisory locks, naming what the second locks.
JOB_ENDINGS_LOCK = 0x5265  # "Re"


def lock_job_endings(job_id: int) -> None:
    """Serialize, per job, the transactions that end its instances and decide what the
    job does next. Without it two ranks of a gang ending at once each still see the
    other as live, and neither moves the job on. Held until the transaction ends; taken
    before any row lock, so it orders enders without ever waiting inside a row-lock
    cycle (heartbeats lock an instance, then its job). SQLite already runs one write
    transaction at a time."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [JOB_ENDINGS_LOCK, job_id])


def end_instance(instance: Instance, end_reason: str, *, message: str = "") -> bool:
    """End a live instance from whatever live state it is in now (retrying once if
    it moved meanwhile, e.g. running -> preempting). Call it in the transaction that
    then moves the job on (respawn_server.jobs.recovery.after_end.after_instance_ended): the job's lock is
    held from here to its end."""
    if instance.state != InstanceState.ENDED:
        lock_job_endings(instance.job_id)
    for _ in range(3):
        if instance.state == InstanceState.ENDED:
            return False
        if transition_instance(instance.pk, instance.state, InstanceState.ENDED, end_reason=end_reason, message=message):
            instance.state = InstanceState.ENDED
            instance.end_reason = end_reason
            return True
        instance.refresh_from_db(fields=["state", "end_reason", "ended_at"])
    return False


def log_job_event(job_id: int, message: str) -> None:
    """A notable happening that is not a status change (a notice, a relaunch)."""
    JobEvent.objects.create(job_id=job_id, message=message)
