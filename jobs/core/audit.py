"""Writing the audit log. Callers record inside the transaction that made the
change, so a change and its audit row commit (or roll back) together. Every
door that submits or cancels a job (API, dashboard) calls the job helpers."""

from __future__ import annotations

from respawn_server.jobs.core.choices import AuditAction
from respawn_server.jobs.models import AuditEvent, Team


def record_audit(actor, action: str, target: str, *, team: Team | int | None = None, **details) -> AuditEvent:
    team_id = team.pk if isinstance(team, Team) else team
    return AuditEvent.objects.create(
        actor=actor, actor_username=actor.get_username(), team_id=team_id, action=action, target=target,
        details=details,
    )


def audit_job_submitted(user, job) -> AuditEvent:
    return record_audit(user, AuditAction.JOB_SUBMITTED, f"job:{job.pk}", team=job.team_id, name=job.name)


def audit_job_cancelled(user, job) -> AuditEvent:
    return record_audit(user, AuditAction.JOB_CANCELLED, f"job:{job.pk}", team=job.team_id, name=job.name)
