"""Who may see what on the dashboard: every answer comes from the ONE permission
table (`respawn_server.jobs.people.permissions`). Another team's object is a 404, as in the API; a role
too small for the action is a 403."""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import PermissionDenied
from django.http import Http404

from respawn_server.frontend import reads
from respawn_server.jobs.models import Job, Team
from respawn_server.jobs.people.permissions import can, roles_of, visible_team_ids

SESSION_TEAM = "respawn_team_id"


@dataclass(frozen=True, slots=True)
class TeamChoice:
    """A team the person can switch to (the pages show its name and link by pk)."""

    pk: int
    name: str


def team_choices(user) -> reads.Read:
    """The teams `user` can switch to, by name (a read to batch with a page's own)."""
    read = reads.team_names(visible_team_ids(user))
    return reads.Read(read.sql, read.params, lambda rows: [TeamChoice(pk, name) for pk, name in rows])


def visible_teams(user) -> list[TeamChoice]:
    return team_choices(user).run()


def current_team(request, teams: list[TeamChoice]) -> TeamChoice | None:
    """The team chosen with the switcher, else the first the person can see."""
    chosen = request.session.get(SESSION_TEAM)
    for team in teams:
        if team.pk == chosen:
            return team
    return teams[0] if teams else None


def current_team_id(request) -> int | None:
    """As `current_team`, reading the teams' names only when none was chosen (or it can
    no longer be seen): the first by name is then the one."""
    chosen = request.session.get(SESSION_TEAM)
    if chosen in visible_team_ids(request.user):
        return chosen
    team = current_team(request, visible_teams(request.user))
    return team.pk if team else None


def require(user, action: str, team_id: int) -> None:
    if team_id not in visible_team_ids(user):
        raise Http404("No such object.")
    if not can(user, action, team_id):
        raise PermissionDenied(f"Your role in this team cannot do {action}.")


def scoped_job(user, pk: int, action: str = "job.view") -> Job:
    job = Job.objects.select_related("team", "owner").filter(pk=pk, team_id__in=visible_team_ids(user)).first()
    if job is None:
        raise Http404("No such job.")
    require(user, action, job.team_id)
    return job


def scoped_job_row(user, pk: int, action: str = "job.view") -> dict:
    """As `scoped_job`, for the polled pages: the job's row as `reads.job` gives it."""
    return require_job_row(user, reads.job(pk).run(), action)


def require_job_row(user, job: dict | None, action: str = "job.view") -> dict:
    """`job` (`reads.job`'s answer, read with others in a page's round trip) if `user` may do `action` to it."""
    if job is None or job["team_id"] not in visible_team_ids(user):
        raise Http404("No such job.")
    require(user, action, job["team_id"])
    return job


def scoped_team(user, pk: int, action: str = "team.view") -> Team:
    require(user, action, pk)
    return Team.objects.get(pk=pk)


def role_in(user, team_id: int) -> str | None:
    return roles_of(user).get(team_id)
