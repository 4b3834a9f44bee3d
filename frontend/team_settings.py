"""The team settings page: anyone in the team reads members and limits; admins
("team.manage") invite (staff: add), re-role and remove members and change limits, and see the
team's recent audit events ("audit.view"). Every change goes through
`respawn_server.jobs.people.team_admin`, which writes its audit row, exactly as the API does."""

from __future__ import annotations

from functools import wraps

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from respawn_server.frontend import access
from respawn_server.frontend.admin_forms import AddMemberForm, LimitsForm, RoleForm
from respawn_server.frontend.views import page
from respawn_server.jobs.core.choices import Role
from respawn_server.jobs.models import AuditEvent, Invitation, Membership
from respawn_server.jobs.people.permissions import can
from respawn_server.jobs.people.team_admin import LastAdminError, add_member, change_limits, change_role, remove_member

AUDIT_EVENTS_SHOWN = 50


def _readable(value) -> str:
    """An audit row's details as a person reads them: 'old → new' for a change."""
    if isinstance(value, dict) and set(value) == {"old", "new"}:
        return f"{_readable(value['old'])} → {_readable(value['new'])}"
    if isinstance(value, dict):
        return "; ".join(f"{key} {_readable(inner)}" for key, inner in value.items())
    return "none" if value is None else str(value)


def _audit_rows(team) -> list[dict]:
    return [{"at": event.created_at, "actor": event.actor_username, "action": event.action, "target": event.target,
             "details": ", ".join(f"{key}: {_readable(value)}" for key, value in event.details.items())}
            for event in AuditEvent.objects.filter(team=team)[:AUDIT_EVENTS_SHOWN]]


def _settings_page(request, team, *, http_status=200, add_form=None, limits_form=None, problem=None):
    user = request.user
    return page(request, "frontend/team_settings.html", http_status=http_status, team=team,
                role=access.role_in(user, team.pk), roles=Role.ALL,
                members=Membership.objects.filter(team=team).select_related("user").order_by("user__username"),
                may_manage=can(user, "team.manage", team.pk),
                invitations=Invitation.objects.filter(team=team).select_related("user").order_by("user__username"),
                events=_audit_rows(team) if can(user, "audit.view", team.pk) else None,
                add_form=add_form or AddMemberForm(), limits_form=limits_form or LimitsForm.of(team), problem=problem)


@login_required
def settings_page(request, pk: int):
    return _settings_page(request, access.scoped_team(request.user, pk))


def admin_post(view):
    """POST only, signed in, and an admin of the team in the URL (another team: 404)."""

    @wraps(view)
    @require_POST
    @login_required
    def wrapper(request, pk: int, **kwargs):
        return view(request, access.scoped_team(request.user, pk, "team.manage"), **kwargs)

    return wrapper


def _back(team):
    return redirect("team-settings", pk=team.pk)


def _membership(team, member_pk: int) -> Membership:
    return get_object_or_404(Membership.objects.select_related("user"), pk=member_pk, team=team)


@admin_post
def member_add(request, team):
    form = AddMemberForm(request.POST)
    if form.is_valid():
        body = form.serializer(team)
        if body.is_valid():
            user, role = body.validated_data["username"], body.validated_data["role"]
            if isinstance(add_member(team, user, role, by=request.user), Invitation):
                messages.success(request, f"{user.get_username()} invited as {role}; they join once they accept.")
            else:
                messages.success(request, f"{user.get_username()} added as {role}.")
            return _back(team)
        form.take_errors(body)
    return _settings_page(request, team, http_status=400, add_form=form)


@admin_post
def member_role(request, team, member_pk: int):
    membership = _membership(team, member_pk)
    form = RoleForm(request.POST)
    if not form.is_valid():
        return _settings_page(request, team, http_status=400, problem=f"role: {' '.join(form.errors['role'])}")
    try:
        change_role(membership, form.cleaned_data["role"], by=request.user)
    except LastAdminError as exc:
        return _settings_page(request, team, http_status=409, problem=str(exc))
    messages.success(request, f"{membership.user.get_username()} is now {membership.role}.")
    return _back(team)


@admin_post
def member_remove(request, team, member_pk: int):
    membership = _membership(team, member_pk)
    try:
        remove_member(membership, by=request.user)
    except LastAdminError as exc:
        return _settings_page(request, team, http_status=409, problem=str(exc))
    messages.success(request, f"{membership.user.get_username()} removed from {team.name}.")
    return _back(team)


@admin_post
def limits_change(request, team):
    form = LimitsForm(request.POST)
    if form.is_valid():
        body = form.serializer(team, request.user)
        if body.is_valid():
            change_limits(team, by=request.user, **body.validated_data)
            messages.success(request, "Limits saved.")
            return _back(team)
        form.take_errors(body)
    return _settings_page(request, team, http_status=400, limits_form=form)
