"""What team admins and token owners change: personal API tokens, memberships
and team limits. Each change writes its audit row in the same transaction."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from respawn_server.jobs.core.audit import record_audit
from respawn_server.jobs.core.choices import AuditAction, Role
from respawn_server.jobs.models import ApiToken, Invitation, Membership, Team
from respawn_server.jobs.people.tokens import PERSONAL_PREFIX, new_token

TOKEN_PREFIX_CHARS = 8


class LastAdminError(Exception):
    """The change would leave the team without an admin, and nobody could manage it."""


@transaction.atomic
def issue_token(user, name: str, *, expires_at=None, via: str = "api") -> tuple[ApiToken, str]:
    """A new personal token and its secret, which is returned here once and never stored."""
    token, digest = new_token(PERSONAL_PREFIX)
    api_token = ApiToken.objects.create(
        user=user, name=name, key_hash=digest, prefix=token[:TOKEN_PREFIX_CHARS], expires_at=expires_at
    )
    record_audit(user, AuditAction.TOKEN_CREATED, f"token:{api_token.pk}", name=name, prefix=api_token.prefix,
                 expires_at=expires_at.isoformat() if expires_at else None, via=via)
    return api_token, token


@transaction.atomic
def revoke_token(api_token: ApiToken, *, by) -> bool:
    """False if it was already revoked (revoking twice changes nothing)."""
    if not ApiToken.objects.filter(pk=api_token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now()):
        return False
    api_token.refresh_from_db(fields=["revoked_at"])
    record_audit(by, AuditAction.TOKEN_REVOKED, f"token:{api_token.pk}", name=api_token.name,
                 prefix=api_token.prefix)
    return True


def _lock_team(team_id: int) -> None:
    # Two admins demoting each other at once must not both see "another admin remains".
    Team.objects.select_for_update().filter(pk=team_id).first()


def _other_admins(membership: Membership) -> bool:
    return Membership.objects.filter(team_id=membership.team_id, role=Role.ADMIN).exclude(pk=membership.pk).exists()


@transaction.atomic
def add_member(team: Team, user, role: str, *, by) -> Membership | Invitation:
    """Deployment staff add a person at once; a team admin's offer is an invitation
    that makes a member only when the person accepts it (`accept_invitation`)."""
    if not by.is_staff:
        invitation = Invitation.objects.create(team=team, user=user, role=role, invited_by=by)
        record_audit(by, AuditAction.MEMBER_INVITED, f"user:{user.get_username()}", team=team, role=role)
        return invitation
    membership = Membership.objects.create(team=team, user=user, role=role)
    record_audit(by, AuditAction.MEMBER_ADDED, f"user:{user.get_username()}", team=team, role=role)
    return membership


def _take_invitation(invitation: Invitation) -> Invitation | None:
    """The invitation, deleted under lock; None if it was already answered."""
    invitation = Invitation.objects.select_for_update().select_related("team").filter(pk=invitation.pk).first()
    if invitation is not None:
        invitation.delete()
    return invitation


@transaction.atomic
def accept_invitation(invitation: Invitation) -> Membership | None:
    """The invited person's yes: they join with the offered role (None if already answered)."""
    taken = _take_invitation(invitation)
    if taken is None:
        return None
    membership = Membership.objects.create(team=taken.team, user=taken.user, role=taken.role)
    record_audit(taken.user, AuditAction.MEMBER_ADDED, f"user:{taken.user.get_username()}", team=taken.team,
                 role=taken.role, invited_by=taken.invited_by.get_username() if taken.invited_by else None)
    return membership


@transaction.atomic
def decline_invitation(invitation: Invitation) -> bool:
    """The invited person's no (False if already answered)."""
    taken = _take_invitation(invitation)
    if taken is not None:
        record_audit(taken.user, AuditAction.INVITATION_DECLINED, f"user:{taken.user.get_username()}",
                     team=taken.team, role=taken.role)
    return taken is not None


@transaction.atomic
def change_role(membership: Membership, role: str, *, by) -> Membership:
    _lock_team(membership.team_id)
    membership.refresh_from_db()
    old = membership.role
    if old == role:
        return membership
    if old == Role.ADMIN and not _other_admins(membership):
        raise LastAdminError(f"{membership.user.get_username()} is the team's only admin; make someone else admin first")
    membership.role = role
    membership.save(update_fields=["role"])
    record_audit(by, AuditAction.MEMBER_ROLE_CHANGED, f"user:{membership.user.get_username()}",
                 team=membership.team_id, old_role=old, new_role=role)
    return membership


@transaction.atomic
def remove_member(membership: Membership, *, by) -> None:
    _lock_team(membership.team_id)
    membership.refresh_from_db()
    if membership.role == Role.ADMIN and not _other_admins(membership):
        raise LastAdminError(f"{membership.user.get_username()} is the team's only admin; make someone else admin first")
    membership.delete()
    record_audit(by, AuditAction.MEMBER_REMOVED, f"user:{membership.user.get_username()}",
                 team=membership.team_id, role=membership.role)


LIMIT_FIELDS = ("monthly_budget_usd", "max_concurrent_gpus")
# The staff-set ceiling of each limit a team admin may change.
CEILINGS = {"monthly_budget_usd": "budget_ceiling_usd", "max_concurrent_gpus": "gpu_ceiling"}


def ceiling_problem(team: Team, field: str, value, *, by) -> str | None:
    """Why `by` may not set the team's `field` to `value`, or None. Deployment staff
    may set anything; a team admin stays within the ceiling staff set (without one,
    within the limit as it is: they may tighten it, not loosen it), and never above
    the deployment's own GPU cap, so no team can take every GPU it has."""
    if by.is_staff:
        return None
    bound = getattr(team, CEILINGS[field])
    if bound is None:
        bound = getattr(team, field)
    cap = settings.RESPAWN["MAX_CONCURRENT_GPUS"] if field == "max_concurrent_gpus" else None
    if cap is not None and (bound is None or bound > cap):
        bound = cap
    if bound is None or (value is not None and value <= bound):
        return None
    return (f"at most {_plain(bound)} for a team admin: the ceiling deployment staff set "
            f"({'lifting the limit' if value is None else 'more'} is theirs to allow)")


@transaction.atomic
def change_limits(team: Team, *, by, **limits) -> Team:
    """Set the given limits (None lifts one); the audit row holds old and new values."""
    team = Team.objects.select_for_update().get(pk=team.pk)
    changes = {}
    for field, new in limits.items():
        if field not in LIMIT_FIELDS:
            raise ValueError(f"{field} is not a team limit; limits are {LIMIT_FIELDS}")
        old = getattr(team, field)
        if old != new:
            changes[field] = {"old": _plain(old), "new": _plain(new)}
            setattr(team, field, new)
    if changes:
        team.save(update_fields=list(changes))
        record_audit(by, AuditAction.LIMITS_CHANGED, f"team:{team.pk}", team=team, changes=changes)
    return team


def _plain(value):
    """JSON-safe: budgets are Decimals, kept exact as strings."""
    return None if value is None else (value if isinstance(value, int) else str(value))
