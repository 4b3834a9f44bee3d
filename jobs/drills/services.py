"""Asking for a drill (the web request: intent recorded, a task queued), sending it to
the cloud (the Celery task) and telling a drill's interruption apart from a preemption."""

from __future__ import annotations

import json
import logging

from django.db import transaction
from django.utils import timezone

from respawn_server.jobs.core import nudges
from respawn_server.jobs.core.audit import record_audit
from respawn_server.jobs.core.choices import AuditAction, DrillStatus, InstanceState, InterruptionKind, JobStatus, NoticeSource, Purpose
from respawn_server.jobs.core.transitions import log_job_event
from respawn_server.jobs.drills import report
from respawn_server.jobs.fleet.providers.base import MissingPermission, ProviderError, TransientError
from respawn_server.jobs.fleet.registry import provider_for
from respawn_server.jobs.models import Drill, Instance, InterruptionEvent, Job

log = logging.getLogger(__name__)


class DrillConflict(Exception):
    """The job cannot be drilled now (409): no running instance of that rank, a drill in flight."""


def drill_target(job: Job, rank: int) -> Instance | None:
    """The job's running training VM of node slot `rank` (not a spare, not a joiner)."""
    return Instance.objects.filter(job=job, rank=rank, state=InstanceState.RUNNING, purpose=Purpose.TRAIN,
                                   standby_for__isnull=True, joining=False).first()


@transaction.atomic
def request_drill(job: Job, *, by, rank: int, with_notice: bool) -> Drill:
    """Record a member's drill of `job`'s node `rank` and queue the task that calls the
    cloud (the web process never does). Raises DrillConflict when there is nothing to drill."""
    job = Job.objects.select_for_update(of=("self",)).get(pk=job.pk)
    if job.status != JobStatus.RUNNING:
        raise DrillConflict(f"job {job.pk} is {job.status}: only a running job can be drilled")
    instance = drill_target(job, rank)
    if instance is None:
        raise DrillConflict(f"job {job.pk} has no running instance of node {rank}")
    open_drill = next((drill for drill in job.drills.filter(status__in=DrillStatus.OPEN) if report.is_open(drill)), None)
    if open_drill is not None:
        raise DrillConflict(f"drill {open_drill.pk} of job {job.pk} is still in flight ({open_drill.status}): one at a time")
    drill = Drill.objects.create(job=job, instance=instance, rank=rank, with_notice=with_notice, requested_by=by)
    how = "with the cloud's notice" if with_notice else "without notice (a hard reclaim)"
    record_audit(by, AuditAction.JOB_DRILLED, f"job:{job.pk}", team=job.team_id, name=job.name, drill=drill.pk,
                 instance=instance.pk, rank=rank, with_notice=with_notice, provider=instance.provider)
    log_job_event(job.pk, f"drill {drill.pk} requested by {by.get_username()}: instance {instance.pk} (node {rank}, "
                          f"{instance.provider}) is interrupted {how}")
    nudges.send_on_commit(nudges.RUN_DRILL, drill.pk)
    return drill


def _move(drill_id: int, old: str, new: str, **fields) -> bool:
    """The drill's guarded transition (DrillStatus.TRANSITIONS): False when another got there first."""
    if new not in DrillStatus.TRANSITIONS[old]:
        raise ValueError(f"drill: {old} -> {new} is not a transition")
    return Drill.objects.filter(pk=drill_id, status=old).update(status=new, **fields) == 1


def run_drill(drill_id: int) -> None:
    """The task's work: interrupt the drill's VM through its cloud. Safe to run twice (a
    drill is claimed by a guarded update); a transient failure puts it back and raises, to
    be retried; a refusal (a missing permission, no VM left) is recorded with its cause."""
    if not _move(drill_id, DrillStatus.REQUESTED, DrillStatus.SENDING):
        return
    drill = Drill.objects.select_related("instance").get(pk=drill_id)
    instance = drill.instance
    if instance.state != InstanceState.RUNNING or not instance.provider_instance_id:
        _refuse(drill, f"instance {instance.pk} is {instance.state} {instance.end_reason}".strip()
                + ": nothing left to interrupt")
        return
    sent_at = timezone.now()
    try:
        answer = provider_for(instance.provider, instance.region).interrupt(instance.provider_instance_id,
                                                                            with_notice=drill.with_notice)
    except TransientError:
        _move(drill_id, DrillStatus.SENDING, DrillStatus.REQUESTED)
        raise
    except MissingPermission as exc:
        _refuse(drill, str(exc), missing_permission=exc.permission)
        return
    except ProviderError as exc:
        _refuse(drill, str(exc))
        return
    with transaction.atomic():
        _move(drill_id, DrillStatus.SENDING, DrillStatus.SENT, interrupted_at=sent_at)
        InterruptionEvent.objects.create(
            instance=instance, kind=InterruptionKind.DRILL, source=NoticeSource.PROVIDER_API, notice_time=sent_at,
            raw=json.dumps({"drill": drill.pk, "with_notice": drill.with_notice, "cloud": answer or ""}))
        log_job_event(drill.job_id, f"drill {drill.pk}: instance {instance.pk} interrupted through {instance.provider}'s "
                                    f"own API ({answer or 'accepted'}); what follows is a drill, no preemption")


def _refuse(drill: Drill, cause: str, *, missing_permission: str = "") -> None:
    with transaction.atomic():
        _move(drill.pk, DrillStatus.SENDING, DrillStatus.REFUSED, cause=cause, missing_permission=missing_permission,
              finished_at=timezone.now())
        log_job_event(drill.job_id, f"drill {drill.pk} refused: {cause}")
    log.info("drill %s of job %s refused: %s", drill.pk, drill.job_id, cause)
