"""The signed-in person's invitations to teams: they join a team only by
accepting here (or through the API). Another person's invitation is a 404."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from respawn_server.frontend.views import page
from respawn_server.jobs.models import Invitation
from respawn_server.jobs.people.team_admin import accept_invitation, decline_invitation


@login_required
def invitations_page(request):
    invitations = (Invitation.objects.filter(user=request.user).select_related("team", "invited_by")
                   .order_by("-created_at", "-id"))
    return page(request, "frontend/invitations.html", invitations=invitations)


def _own(request, invitation_pk: int) -> Invitation:
    return get_object_or_404(Invitation, pk=invitation_pk, user=request.user)


@require_POST
@login_required
def invitation_accept(request, invitation_pk: int):
    membership = accept_invitation(_own(request, invitation_pk))
    if membership is not None:
        messages.success(request, f"You joined {membership.team.name} as {membership.role}.")
    return redirect("invitations")


@require_POST
@login_required
def invitation_decline(request, invitation_pk: int):
    decline_invitation(_own(request, invitation_pk))
    messages.success(request, "Invitation declined.")
    return redirect("invitations")
