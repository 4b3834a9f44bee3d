"""The team settings page and its POSTs × every role × own team / other team /
anonymous, with the expected answer derived from the ONE permission table; an
allowed change really happens and is audited, a refused one changes nothing."""

import re
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.test import Client

from respawn_server.jobs.core.choices import AuditAction, Role
from respawn_server.jobs.models import AuditEvent, Invitation, Membership, Team
from respawn_server.jobs.people.permissions import role_allows
from tests.factories import make_team_with_members

WHO = [Role.VIEWER, Role.MEMBER, Role.ADMIN, "outsider", "anonymous"]

# (name, method, url template, action, success status, body, audit action an allowed call writes)
ENDPOINTS = [
    ("settings-page", "get", "/teams/{team}/settings/", "team.view", 200, None, None),
    ("member-add", "post", "/teams/{team}/settings/members/", "team.manage", 302,
     {"username": "newcomer", "role": Role.MEMBER}, AuditAction.MEMBER_INVITED),
    ("member-role", "post", "/teams/{team}/settings/members/{viewer}/role/", "team.manage", 302,
     {"role": Role.MEMBER}, AuditAction.MEMBER_ROLE_CHANGED),
    ("member-remove", "post", "/teams/{team}/settings/members/{viewer}/remove/", "team.manage", 302,
     {}, AuditAction.MEMBER_REMOVED),
    ("limits", "post", "/teams/{team}/settings/limits/", "team.manage", 302,
     {"monthly_budget_usd": "250.50", "max_concurrent_gpus": "4"}, AuditAction.LIMITS_CHANGED),
]


def expected_status(action, who, success):
    if who == "anonymous":
        return 302  # to the login page
    if who == "outsider":
        return 404  # another team does not exist for you
    return success if role_allows(who, action) else 403


def team_state(team):
    """What a settings POST may change: memberships, limits, audit rows."""
    team = Team.objects.get(pk=team.pk)
    members = sorted(Membership.objects.filter(team=team).values_list("user__username", "role"))
    return members, team.monthly_budget_usd, team.max_concurrent_gpus, AuditEvent.objects.count()


def signed_in(person=None, **kwargs) -> Client:
    client = Client(**kwargs)
    if person is not None:
        client.force_login(person.user)
    return client


@pytest.mark.parametrize("who", WHO)
@pytest.mark.parametrize("name,method,url,action,success,body,audited", ENDPOINTS, ids=[e[0] for e in ENDPOINTS])
def test_team_settings_authorization_matrix(db, name, method, url, action, success, body, audited, who):
    setup = make_team_with_members()
    User.objects.create_user("newcomer")
    viewer = Membership.objects.get(team=setup.team, role=Role.VIEWER)
    before = team_state(setup.team)
    client = signed_in(setup.people.get(who))
    response = getattr(client, method)(url.format(team=setup.team.pk, viewer=viewer.pk), body)
    expected = expected_status(action, who, success)
    assert response.status_code == expected, response.content[:500]
    if who == "anonymous":
        assert response["Location"].startswith("/login/")
    if audited is None:
        return
    if who in Role.ALL and role_allows(who, action):
        assert team_state(setup.team) != before
        event = AuditEvent.objects.latest("pk")
        assert (event.action, event.actor_username, event.team_id) == (audited, f"vision-{who}", setup.team.pk)
    else:
        assert team_state(setup.team) == before, "a refused settings POST changed something"


def test_every_settings_action_is_in_the_permission_table():
    from respawn_server.jobs.people.permissions import PERMISSIONS

    assert {e[3] for e in ENDPOINTS} <= set(PERMISSIONS)


def test_a_viewer_reads_members_and_limits_but_gets_no_forms_and_no_audit(db):
    setup = make_team_with_members()
    html = signed_in(setup.people[Role.VIEWER]).get(f"/teams/{setup.team.pk}/settings/").content.decode()
    assert "vision-admin" in html and "vision-member" in html
    assert "$1000.00" in html and re.search(r"Max concurrent GPUs</dt><dd>8<", html)
    for form_id in ("limits-form", "add-member-form", "audit-table"):
        assert f'id="{form_id}"' not in html


def test_an_admin_sees_forms_and_the_teams_audit_events(db):
    setup = make_team_with_members()
    admin = signed_in(setup.people[Role.ADMIN])
    admin.post(f"/teams/{setup.team.pk}/settings/limits/", {"monthly_budget_usd": "500", "max_concurrent_gpus": "4"})
    html = admin.get(f"/teams/{setup.team.pk}/settings/").content.decode()
    assert 'id="limits-form"' in html and 'id="add-member-form"' in html
    audit = html[html.index('id="audit-table"'):]
    assert AuditAction.LIMITS_CHANGED in audit and "vision-admin" in audit
    assert "monthly_budget_usd 1000.00 → 500.00; max_concurrent_gpus 8 → 4" in audit


def test_the_team_page_links_to_settings(db):
    setup = make_team_with_members()
    html = signed_in(setup.people[Role.VIEWER]).get(f"/teams/{setup.team.pk}/").content.decode()
    assert f'href="/teams/{setup.team.pk}/settings/"' in html


def test_an_invited_person_who_accepts_gets_the_role_and_sees_the_team(db):
    setup = make_team_with_members()
    newcomer = User.objects.create_user("newcomer")
    response = signed_in(setup.people[Role.ADMIN]).post(f"/teams/{setup.team.pk}/settings/members/",
                                                        {"username": "newcomer", "role": Role.VIEWER}, follow=True)
    assert b"newcomer invited as viewer; they join once they accept." in response.content
    assert 'data-invited="newcomer"' in response.content.decode()
    client = Client()
    client.force_login(newcomer)
    assert client.get(f"/teams/{setup.team.pk}/settings/").status_code == 404
    invitation = Invitation.objects.get(team=setup.team, user=newcomer)
    assert client.post(f"/invitations/{invitation.pk}/accept/", follow=True).status_code == 200
    assert Membership.objects.get(team=setup.team, user=newcomer).role == Role.VIEWER
    assert client.get(f"/teams/{setup.team.pk}/settings/").status_code == 200


@pytest.mark.parametrize("body,message", [
    ({"username": "nobody", "role": Role.MEMBER}, "no user named &#x27;nobody&#x27;"),
    ({"username": "vision-member", "role": Role.MEMBER}, "vision-member is already in the team"),
    ({"username": "newcomer", "role": "owner"}, "Select a valid choice"),
])
def test_a_bad_new_member_is_refused_by_name(db, body, message):
    setup = make_team_with_members()
    User.objects.create_user("newcomer")
    before = team_state(setup.team)
    response = signed_in(setup.people[Role.ADMIN]).post(f"/teams/{setup.team.pk}/settings/members/", body)
    assert response.status_code == 400
    assert message in response.content.decode()
    assert team_state(setup.team) == before


def test_blank_limits_lift_them_and_bad_ones_are_refused(db):
    setup = make_team_with_members()
    User.objects.filter(pk=setup.people[Role.ADMIN].user.pk).update(is_staff=True)  # lifting is staff's
    admin = signed_in(setup.people[Role.ADMIN])
    url = f"/teams/{setup.team.pk}/settings/limits/"
    assert admin.post(url, {"monthly_budget_usd": "", "max_concurrent_gpus": ""}).status_code == 302
    setup.team.refresh_from_db()
    assert (setup.team.monthly_budget_usd, setup.team.max_concurrent_gpus) == (None, None)
    event = AuditEvent.objects.get(action=AuditAction.LIMITS_CHANGED)
    assert event.details["changes"]["monthly_budget_usd"] == {"old": "1000.00", "new": None}
    response = admin.post(url, {"monthly_budget_usd": "-5", "max_concurrent_gpus": "two"})
    assert response.status_code == 400
    assert b"greater than or equal to 0" in response.content and b"Enter a whole number" in response.content
    setup.team.refresh_from_db()
    assert (setup.team.monthly_budget_usd, setup.team.max_concurrent_gpus) == (None, None)
    assert admin.post(url, {"monthly_budget_usd": "99.5", "max_concurrent_gpus": "3"}).status_code == 302
    setup.team.refresh_from_db()
    assert (setup.team.monthly_budget_usd, setup.team.max_concurrent_gpus) == (Decimal("99.50"), 3)


def test_the_last_admin_can_be_neither_demoted_nor_removed(db):
    setup = make_team_with_members()
    admin = signed_in(setup.people[Role.ADMIN])
    own = Membership.objects.get(team=setup.team, role=Role.ADMIN)
    before = team_state(setup.team)
    for url, body in [(f"/teams/{setup.team.pk}/settings/members/{own.pk}/role/", {"role": Role.MEMBER}),
                      (f"/teams/{setup.team.pk}/settings/members/{own.pk}/remove/", {})]:
        response = admin.post(url, body)
        assert response.status_code == 409
        assert "vision-admin is the team&#x27;s only admin; make someone else admin first" in response.content.decode()
        assert team_state(setup.team) == before


def test_with_a_second_admin_the_first_may_step_down(db):
    setup = make_team_with_members()
    admin = signed_in(setup.people[Role.ADMIN])
    member = Membership.objects.get(team=setup.team, role=Role.MEMBER)
    own = Membership.objects.get(team=setup.team, role=Role.ADMIN)
    assert admin.post(f"/teams/{setup.team.pk}/settings/members/{member.pk}/role/", {"role": Role.ADMIN}).status_code == 302
    assert admin.post(f"/teams/{setup.team.pk}/settings/members/{own.pk}/remove/").status_code == 302
    assert sorted(Membership.objects.filter(team=setup.team).values_list("role", flat=True)) == [Role.ADMIN, Role.VIEWER]
    assert admin.get(f"/teams/{setup.team.pk}/settings/").status_code == 404  # no longer in the team


def test_an_admin_cannot_reach_another_teams_membership_through_their_own_team(db):
    setup = make_team_with_members()
    foreign = Membership.objects.get(team=setup.other_team)
    before = team_state(setup.other_team)
    admin = signed_in(setup.people[Role.ADMIN])
    for action, body in [("role", {"role": Role.VIEWER}), ("remove", {})]:
        response = admin.post(f"/teams/{setup.team.pk}/settings/members/{foreign.pk}/{action}/", body)
        assert response.status_code == 404
    assert team_state(setup.other_team) == before


def test_an_unknown_role_is_refused_and_nothing_changes(db):
    setup = make_team_with_members()
    viewer = Membership.objects.get(team=setup.team, role=Role.VIEWER)
    before = team_state(setup.team)
    response = signed_in(setup.people[Role.ADMIN]).post(
        f"/teams/{setup.team.pk}/settings/members/{viewer.pk}/role/", {"role": "owner"})
    assert response.status_code == 400 and b"role: Select a valid choice" in response.content
    assert team_state(setup.team) == before


@pytest.mark.parametrize("path,body", [
    ("members/", {"username": "newcomer", "role": Role.MEMBER}),
    ("members/{viewer}/role/", {"role": Role.MEMBER}),
    ("members/{viewer}/remove/", {}),
    ("limits/", {"monthly_budget_usd": "1", "max_concurrent_gpus": "1"}),
])
def test_settings_posts_need_the_csrf_token(db, path, body):
    setup = make_team_with_members()
    User.objects.create_user("newcomer")
    viewer = Membership.objects.get(team=setup.team, role=Role.VIEWER)
    url = f"/teams/{setup.team.pk}/settings/" + path.format(viewer=viewer.pk)
    browser = signed_in(setup.people[Role.ADMIN], enforce_csrf_checks=True)
    before = team_state(setup.team)
    assert browser.post(url, body).status_code == 403
    assert team_state(setup.team) == before
    browser.get(f"/teams/{setup.team.pk}/settings/")  # sets the CSRF cookie, as a browser's visit would
    token = browser.cookies["csrftoken"].value
    assert browser.post(url, {**body, "csrfmiddlewaretoken": token}).status_code == 302
    assert team_state(setup.team) != before
