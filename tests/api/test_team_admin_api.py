"""Team administration: admins manage members, roles and limits; a team always
keeps an admin; every change is audited."""

from decimal import Decimal

import pytest
from django.contrib.auth.models import User

from respawn_server.jobs.core.choices import AuditAction, Role
from respawn_server.jobs.models import AuditEvent, Membership, Team
from tests.api.clients import client_for
from tests.factories import make_person, make_team_with_members


@pytest.fixture
def setup(db):
    return make_team_with_members()


def members_url(setup, username=""):
    return f"/api/v1/teams/{setup.team.pk}/members/" + (f"{username}/" if username else "")


def test_admin_invites_by_username_with_a_role_and_the_person_joins_by_accepting(setup):
    newbie = make_person("newbie")
    admin = client_for(setup.people["admin"])
    response = admin.post(members_url(setup), {"username": "newbie", "role": Role.VIEWER}, format="json")
    assert response.status_code == 202, response.content
    assert {k: response.json()[k] for k in ("username", "role", "team_name")} == {
        "username": "newbie", "role": "viewer", "team_name": "vision"}
    assert client_for(newbie).get(f"/api/v1/teams/{setup.team.pk}/").status_code == 404
    accepted = client_for(newbie).post(f"/api/v1/invitations/{response.json()['id']}/accept/")
    assert accepted.status_code == 200
    assert client_for(newbie).get(f"/api/v1/teams/{setup.team.pk}/").json()["role"] == "viewer"
    listed = admin.get(members_url(setup)).json()["results"]
    assert {m["username"]: m["role"] for m in listed}["newbie"] == "viewer"


def test_adding_names_the_wrong_field(setup):
    admin = client_for(setup.people["admin"])
    unknown = admin.post(members_url(setup), {"username": "nobody", "role": "viewer"}, format="json")
    assert unknown.status_code == 400 and "nobody" in unknown.json()["errors"]["username"][0]
    twice = admin.post(members_url(setup), {"username": "vision-viewer", "role": "member"}, format="json")
    assert twice.status_code == 400 and "already" in twice.json()["errors"]["username"][0]
    make_person("newbie")
    bad_role = admin.post(members_url(setup), {"username": "newbie", "role": "owner"}, format="json")
    assert bad_role.status_code == 400 and "role" in bad_role.json()["errors"]


def test_admin_changes_a_role_and_removes_a_member(setup):
    admin = client_for(setup.people["admin"])
    changed = admin.patch(members_url(setup, "vision-viewer"), {"role": Role.MEMBER}, format="json")
    assert changed.status_code == 200 and changed.json()["role"] == "member"
    assert admin.delete(members_url(setup, "vision-member")).status_code == 204
    assert not Membership.objects.filter(team=setup.team, user__username="vision-member").exists()
    assert client_for(setup.people["member"]).get(f"/api/v1/teams/{setup.team.pk}/").status_code == 404


def test_the_last_admin_can_be_neither_demoted_nor_removed(setup):
    admin = client_for(setup.people["admin"])
    demoted = admin.patch(members_url(setup, "vision-admin"), {"role": Role.MEMBER}, format="json")
    assert demoted.status_code == 409 and "only admin" in demoted.json()["detail"]
    assert admin.delete(members_url(setup, "vision-admin")).status_code == 409
    assert Membership.objects.get(team=setup.team, user__username="vision-admin").role == Role.ADMIN
    admin.patch(members_url(setup, "vision-member"), {"role": Role.ADMIN}, format="json")
    assert admin.patch(members_url(setup, "vision-admin"), {"role": Role.VIEWER}, format="json").status_code == 200


def test_members_and_viewers_read_but_cannot_change_the_team(setup):
    member = client_for(setup.people["member"])
    assert member.get(members_url(setup)).status_code == 200
    assert member.patch(members_url(setup, "vision-viewer"), {"role": "admin"}, format="json").status_code == 403
    assert member.patch(f"/api/v1/teams/{setup.team.pk}/limits/", {"max_concurrent_gpus": 99},
                        format="json").status_code == 403
    assert Team.objects.get(pk=setup.team.pk).max_concurrent_gpus == 8


def test_admin_sets_limits_up_to_the_ceilings_and_staff_lift_them(setup):
    Team.objects.filter(pk=setup.team.pk).update(budget_ceiling_usd=3000, gpu_ceiling=16)
    admin = client_for(setup.people["admin"])
    url = f"/api/v1/teams/{setup.team.pk}/limits/"
    response = admin.patch(url, {"monthly_budget_usd": "2500.50", "max_concurrent_gpus": 16}, format="json")
    assert response.status_code == 200, response.content
    assert response.json() == {"monthly_budget_usd": "2500.50", "max_concurrent_gpus": 16,
                               "budget_ceiling_usd": "3000.00", "gpu_ceiling": 16}
    User.objects.filter(pk=setup.people["admin"].user.pk).update(is_staff=True)
    assert admin.patch(url, {"max_concurrent_gpus": None}, format="json").json()["max_concurrent_gpus"] is None
    team = Team.objects.get(pk=setup.team.pk)
    assert team.monthly_budget_usd == Decimal("2500.50") and team.max_concurrent_gpus is None
    assert client_for(setup.people["viewer"]).get(url).json()["monthly_budget_usd"] == "2500.50"


def test_bad_limits_name_the_field(setup):
    admin = client_for(setup.people["admin"])
    url = f"/api/v1/teams/{setup.team.pk}/limits/"
    response = admin.patch(url, {"monthly_budget_usd": "-5", "max_concurrent_gpus": "lots"}, format="json")
    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"monthly_budget_usd", "max_concurrent_gpus"}
    assert Team.objects.get(pk=setup.team.pk).monthly_budget_usd == Decimal("1000")


def test_every_change_is_audited_with_its_details(setup):
    newbie = make_person("newbie")
    admin = client_for(setup.people["admin"])
    invitation = admin.post(members_url(setup), {"username": "newbie", "role": "viewer"}, format="json").json()
    client_for(newbie).post(f"/api/v1/invitations/{invitation['id']}/accept/")
    admin.patch(members_url(setup, "newbie"), {"role": "member"}, format="json")
    admin.delete(members_url(setup, "newbie"))
    admin.patch(f"/api/v1/teams/{setup.team.pk}/limits/", {"max_concurrent_gpus": 4}, format="json")
    admin.patch(f"/api/v1/teams/{setup.team.pk}/limits/", {"max_concurrent_gpus": 4}, format="json")  # no change
    rows = list(AuditEvent.objects.filter(team=setup.team).order_by("id"))
    assert [(r.actor_username, r.action, r.target) for r in rows] == [
        ("vision-admin", AuditAction.MEMBER_INVITED, "user:newbie"),
        ("newbie", AuditAction.MEMBER_ADDED, "user:newbie"),
        ("vision-admin", AuditAction.MEMBER_ROLE_CHANGED, "user:newbie"),
        ("vision-admin", AuditAction.MEMBER_REMOVED, "user:newbie"),
        ("vision-admin", AuditAction.LIMITS_CHANGED, f"team:{setup.team.pk}"),
    ]
    assert rows[1].details == {"role": "viewer", "invited_by": "vision-admin"}
    assert rows[2].details == {"old_role": "viewer", "new_role": "member"}
    assert rows[4].details == {"changes": {"max_concurrent_gpus": {"old": 8, "new": 4}}}
    assert User.objects.filter(username="newbie").exists()


def test_list_query_counts_do_not_grow_with_rows(setup):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    admin = client_for(setup.people["admin"])
    urls = [members_url(setup), "/api/v1/audit/", "/api/v1/tokens/"]

    def counts():
        with CaptureQueriesContext(connection) as queries:
            for url in urls:
                assert admin.get(url).status_code == 200
        return len(queries)

    make_person("first")  # one row in each list, so the baseline pays for fetching rows too
    admin.post(members_url(setup), {"username": "first", "role": "viewer"}, format="json")
    counts()  # the first call also stamps the token's last use
    few = counts()
    for i in range(5):
        person = make_person(f"extra-{i}")
        admin.post(members_url(setup), {"username": person.user.username, "role": "viewer"}, format="json")
        admin.post("/api/v1/tokens/", {"name": f"t{i}"}, format="json")
    assert counts() == few
