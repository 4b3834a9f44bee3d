"""Writing the audit log. Callers record inside the transaction that made the
change, so a change and its audit row commit (or roll back) together."""

from __future__ import annotations

from jobs.models import AuditEvent, Team


def record_audit(actor, action: str, target: str, *, team: Team | int | None = None, **details) -> AuditEvent:
    team_id = team.pk if isinstance(team, Team) else team
    return AuditEvent.objects.create(
        actor=actor, actor_username=actor.get_username(), team_id=team_id, action=action, target=target,
        details=details,
    )
