"""ONE permission table: which role a person needs in a team to do each action.

The REST API (and the dashboard) ask `can(user, action, team_id)` and nothing
else. Objects of a team the user is not in are filtered out of every queryset,
so they answer 404, never 403: another team's object does not exist for you."""

from __future__ import annotations

from respawn_server.jobs.core.choices import Role

# action -> least role that may do it
PERMISSIONS: dict[str, str] = {
    "team.view": Role.VIEWER,
    "job.view": Role.VIEWER,
    "job.create": Role.MEMBER,
    "job.cancel": Role.MEMBER,
    "job.drill": Role.MEMBER,  # interrupt one of its VMs on purpose (respawn_server.jobs.drills)
    "instance.view": Role.VIEWER,
    "checkpoint.view": Role.VIEWER,
    "interruption.view": Role.VIEWER,
    "team.manage": Role.ADMIN,
    "audit.view": Role.ADMIN,
    "subscription.manage_team": Role.ADMIN,  # the team's notification subscriptions
    "subscription.manage_own": Role.VIEWER,  # one's own: anyone who sees the team's jobs may be told of them
}

# Open to any signed-in person, whatever their teams: public list prices, their
# own API tokens and their own invitations to teams (a person's, not a team's:
# other people's are 404).
OPEN_ACTIONS = frozenset({"price.view", "token.manage", "invitation.respond"})


def role_allows(role: str | None, action: str) -> bool:
    if action in OPEN_ACTIONS:
        return True
    if role is None:
        return False
    return Role.RANK[role] >= Role.RANK[PERMISSIONS[action]]


def roles_of(user) -> dict[int, str]:
    """team id -> role, cached on the user object for the request."""
    if not getattr(user, "is_authenticated", False):
        return {}
    cached = getattr(user, "_respawn_roles", None)
    if cached is None:
        from django.db import connection

        from respawn_server.jobs.models import Membership

        # Asked on every request: in SQL, as building the ORM query cost ten times its answer.
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT team_id, role FROM {Membership._meta.db_table} WHERE user_id = %s", [user.pk])
            cached = dict(cursor.fetchall())
        user._respawn_roles = cached
    return cached


def can(user, action: str, team_id: int | None) -> bool:
    return role_allows(roles_of(user).get(team_id), action)


def may_read_env_values(user, job) -> bool:
    """A job's env values (API keys, often) go to whoever may run the team's jobs and
    to the job's owner; a viewer reads the names only."""
    return job.owner_id == user.pk or can(user, "job.create", job.team_id)


def visible_team_ids(user) -> list[int]:
    """Teams whose objects `user` may see at all; other teams' objects are 404."""
    return [team_id for team_id, role in roles_of(user).items() if role_allows(role, "team.view")]
