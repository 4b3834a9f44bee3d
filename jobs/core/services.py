"""Operations on jobs: submit and cancel, and the few steps every subsystem takes on a
job's instances (ask them for an action, fence them, nudge the scheduler, the checkpoint
a job resumes from, the heartbeat's answer). Views and tasks call these; they never
touch status fields themselves (that is `respawn_server.jobs.core.transitions`). What an
agent reports is `respawn_server.jobs.reports`; what follows an instance's end,
`respawn_server.jobs.recovery`."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from respawn.protocol import Action, ValidationResult
from respawn_server.jobs.core import nudges, secret_env
from respawn_server.jobs.core.audit import audit_job_cancelled, audit_job_submitted
from respawn_server.jobs.core.choices import EndReason, InstanceState, JobStatus
from respawn_server.jobs.core.transitions import end_instance, log_job_event, transition_job
from respawn_server.jobs.models import Checkpoint, Instance, Job


def heartbeat_timeout() -> timedelta:
    return timedelta(seconds=settings.RESPAWN["HEARTBEAT_TIMEOUT_S"])


def checkpoint_interval_s(instance: Instance) -> float:
    """The interval the agent is told (stored, so the heartbeat stays cheap)."""
    if instance.checkpoint_interval:
        return instance.checkpoint_interval["seconds"]
    return instance.job.checkpoint_interval_s or settings.RESPAWN["DEFAULT_CHECKPOINT_INTERVAL_S"]


def heartbeat_action(instance: Instance) -> str:
    if instance.state == InstanceState.ENDED:
        return Action.STOP  # fenced or ended: its replacement owns the slot now
    if instance.job.status in (JobStatus.CANCELLING, JobStatus.CANCELLED):
        return Action.STOP
    return instance.requested_action or Action.CONTINUE


def usable_checkpoint(job: Job) -> Checkpoint | None:
    """The newest committed checkpoint not known to be invalid (pending counts)."""
    return job.checkpoints.exclude(validation=ValidationResult.INVALID).order_by("-step", "-committed_at").first()


def nudge_schedule() -> None:
    """Ask a worker to schedule now (after commit); beat's periodic run is the safety net."""
    nudges.send_on_commit(nudges.SCHEDULE)


def enqueue_terminate(instance_id: int) -> None:
    nudges.send_on_commit(nudges.TERMINATE_INSTANCE, instance_id)


@transaction.atomic
def create_job(**fields) -> Job:
    """Every door that submits (API, dashboard, demo) comes here: the job, its first
    event and its audit row commit together."""
    job = Job.objects.create(**{**fields, "secret_env": secret_env.seal(fields.get("secret_env") or {})})
    log_job_event(job.pk, f"submitted by {job.owner}")
    audit_job_submitted(job.owner, job)
    nudge_schedule()
    return job


@transaction.atomic
def cancel_job(job: Job, *, by) -> bool:
    """Queued jobs end at once; jobs with VMs go through `cancelling` until every
    live instance has ended. Returns False if the job was already finished.
    `by` is the person cancelling; the cancel is audited in the same transaction."""
    for _ in range(3):
        job.refresh_from_db(fields=["status"])
        if job.status == JobStatus.QUEUED:
            if transition_job(job.pk, JobStatus.QUEUED, JobStatus.CANCELLED, message=f"cancelled by {by}"):
                audit_job_cancelled(by, job)
                return True
        elif job.status in JobStatus.ACTIVE:
            if transition_job(job.pk, job.status, JobStatus.CANCELLING, message=f"cancelled by {by}"):
                for pk in Instance.objects.filter(job_id=job.pk, state__in=InstanceState.LIVE).values_list("pk", flat=True):
                    enqueue_terminate(pk)
                finish_cancelling(job.pk)
                audit_job_cancelled(by, job)
                return True
        else:
            return job.status == JobStatus.CANCELLING
    return False


def finish_cancelling(job_id: int) -> None:
    if not Instance.objects.filter(job_id=job_id, state__in=InstanceState.LIVE).exists():
        transition_job(job_id, JobStatus.CANCELLING, JobStatus.CANCELLED, message="every instance has ended")


def request_action(job_id: int, action: str, *, exclude: int | None = None, spares: bool = True) -> None:
    live = Instance.objects.filter(job_id=job_id, state__in=InstanceState.LIVE).exclude(pk=exclude)
    (live if spares else live.filter(standby_for__isnull=True)).update(requested_action=action,
                                                                       requested_action_at=timezone.now())


def fence(instances, message: str) -> list[Instance]:
    """End each of `instances`, whose VM the job will not need (fenced), and terminate
    the VM; returns those this call ended."""
    ended = [instance for instance in instances if end_instance(instance, EndReason.FENCED, message=message[:500])]
    for instance in ended:
        if instance.provider_instance_id:
            enqueue_terminate(instance.pk)
    return ended


def steps_since_checkpoint(instance: Instance, reached: int | None = None) -> int:
    newest = instance.job.checkpoints.order_by("-step").values_list("step", flat=True).first() or 0
    return max(0, max(instance.last_step, reached or 0) - newest)
