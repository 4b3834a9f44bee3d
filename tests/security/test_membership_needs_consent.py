"""Nobody is put in a team without saying yes: a team admin's "add" is an
invitation the person accepts or declines (API and dashboard), and nobody else
can answer it. Deployment staff add directly. A team admin's audit log shows the
team's events, never a member's personal token activity."""

from __future__ import annotations

import pytest
from django.test import Client

from respawn_server.jobs.core.choices import AuditAction, Role
from respawn_server.jobs.models import Invitation, Membership
from tests.api.clients import client_for
from tests.factories import make_person, make_team_with_members


@pytest.fixture
def setup(db):
    return make_team_with_members()


def invite(setup, username="stranger"):
    return client_for(setup.people[Role.ADMIN]).post(f"/api/v1/teams/{setup.team.pk}/members/",
                                                     {"username": username, "role": Role.ADMIN}, format="json")


def test_a_team_admin_only_invites_and_the_person_is_not_in_the_team_until_they_accept(setup):
    stranger = make_person("stranger")
    assert invite(setup).status_code == 202
    assert not Membership.objects.filter(user=stranger.user).exists()
    assert client_for(stranger).get(f"/api/v1/teams/{setup.team.pk}/").status_code == 404
    mine = client_for(stranger).get("/api/v1/invitations/").json()["results"]
    assert [(i["team_name"], i["role"], i["invited_by"]) for i in mine] == [("vision", "admin", "vision-admin")]
    assert client_for(stranger).post(f"/api/v1/invitations/{mine[0]['id']}/accept/").status_code == 200
    assert Membership.objects.get(user=stranger.user, team=setup.team).role == Role.ADMIN
    assert client_for(stranger).post(f"/api/v1/invitations/{mine[0]['id']}/accept/").status_code == 404


def test_a_declined_invitation_makes_no_member(setup):
    stranger = make_person("stranger")
    invitation = invite(setup).json()
    assert client_for(stranger).post(f"/api/v1/invitations/{invitation['id']}/decline/").status_code == 204
    assert not Membership.objects.filter(user=stranger.user).exists()
    assert not Invitation.objects.exists()


def test_nobody_else_answers_an_invitation(setup):
    make_person("stranger")
    invitation = invite(setup).json()
    for someone in (setup.people[Role.ADMIN], setup.people["outsider"]):
        assert client_for(someone).post(f"/api/v1/invitations/{invitation['id']}/accept/").status_code == 404
        page = Client()
        page.force_login(someone.user)
        assert page.post(f"/invitations/{invitation['id']}/accept/").status_code == 404
    assert Invitation.objects.count() == 1 and not Membership.objects.filter(user__username="stranger").exists()


def test_the_dashboard_invites_and_the_person_accepts_there(setup):
    stranger = make_person("stranger")
    admin = Client()
    admin.force_login(setup.people[Role.ADMIN].user)
    admin.post(f"/teams/{setup.team.pk}/settings/members/", {"username": "stranger", "role": Role.MEMBER})
    assert not Membership.objects.filter(user=stranger.user).exists()
    page = Client()
    page.force_login(stranger.user)
    listed = page.get("/invitations/").content.decode()
    invitation = Invitation.objects.get(user=stranger.user)
    assert f'action="/invitations/{invitation.pk}/accept/"' in listed and "vision" in listed
    assert b"You joined vision as member." in page.post(f"/invitations/{invitation.pk}/accept/", follow=True).content
    assert Membership.objects.get(user=stranger.user, team=setup.team).role == Role.MEMBER


def test_staff_add_directly(setup):
    stranger = make_person("stranger")
    setup.people[Role.ADMIN].user.is_staff = True
    setup.people[Role.ADMIN].user.save()
    assert invite(setup).status_code == 201
    assert Membership.objects.get(user=stranger.user, team=setup.team).role == Role.ADMIN


def test_a_team_admin_does_not_read_a_members_personal_token_activity(setup):
    member, admin = setup.people[Role.MEMBER], setup.people[Role.ADMIN]
    client_for(member).post("/api/v1/tokens/", {"name": "home laptop"}, format="json")
    client_for(admin).post("/api/v1/tokens/", {"name": "desk"}, format="json")
    rows = client_for(admin).get(f"/api/v1/audit/?action={AuditAction.TOKEN_CREATED}").json()["results"]
    assert [r["details"]["name"] for r in rows] == ["desk"]  # their own only
    page = Client()
    page.force_login(admin.user)
    assert "home laptop" not in page.get(f"/teams/{setup.team.pk}/settings/").content.decode()
