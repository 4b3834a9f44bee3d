"""Every people's-API endpoint x every role x own team / other team / anonymous,
with the expected status derived from the ONE permission table."""

import pytest
from rest_framework.test import APIClient

from respawn_server.jobs.core.audit import record_audit
from respawn_server.jobs.core.choices import AuditAction, Role
from respawn_server.jobs.models import ApiToken, Checkpoint, Invitation, InterruptionEvent, Subscription
from respawn_server.jobs.people.permissions import OPEN_ACTIONS, PERMISSIONS, role_allows
from tests.factories import make_instance, make_job, make_person, make_team_with_members

# (name, method, url template, action, success status); request bodies in BODIES
ENDPOINTS = [
    ("jobs-list", "get", "/api/v1/jobs/", "job.view", 200),
    ("jobs-create", "post", "/api/v1/jobs/", "job.create", 201),
    ("jobs-detail", "get", "/api/v1/jobs/{job}/", "job.view", 200),
    ("jobs-events", "get", "/api/v1/jobs/{job}/events/", "job.view", 200),
    ("jobs-cancel", "post", "/api/v1/jobs/{job}/cancel/", "job.cancel", 202),
    # The matrix's job is queued: whoever may drill it is let through to "nothing runs to drill".
    ("jobs-drill", "post", "/api/v1/jobs/{job}/drill/", "job.drill", 409),
    ("jobs-drills", "get", "/api/v1/jobs/{job}/drills/", "job.view", 200),
    ("instances-list", "get", "/api/v1/instances/", "instance.view", 200),
    ("instances-detail", "get", "/api/v1/instances/{instance}/", "instance.view", 200),
    ("checkpoints-list", "get", "/api/v1/checkpoints/", "checkpoint.view", 200),
    ("checkpoints-detail", "get", "/api/v1/checkpoints/{checkpoint}/", "checkpoint.view", 200),
    ("interruptions-list", "get", "/api/v1/interruptions/", "interruption.view", 200),
    ("interruptions-detail", "get", "/api/v1/interruptions/{interruption}/", "interruption.view", 200),
    ("teams-list", "get", "/api/v1/teams/", "team.view", 200),
    ("teams-detail", "get", "/api/v1/teams/{team}/", "team.view", 200),
    ("prices-list", "get", "/api/v1/prices/", "price.view", 200),
    ("interruption-rates", "get", "/api/v1/interruption-rates/", "price.view", 200),
    ("jobs-logs", "get", "/api/v1/jobs/{job}/logs/", "job.view", 200),
    ("jobs-cost", "get", "/api/v1/jobs/{job}/cost/", "job.view", 200),
    ("teams-cost", "get", "/api/v1/teams/{team}/cost/", "team.view", 200),
    ("tokens-list", "get", "/api/v1/tokens/", "token.manage", 200),
    ("tokens-create", "post", "/api/v1/tokens/", "token.manage", 201),
    ("tokens-detail", "get", "/api/v1/tokens/{token}/", "token.manage", 200),
    ("tokens-revoke", "post", "/api/v1/tokens/{token}/revoke/", "token.manage", 200),
    ("members-list", "get", "/api/v1/teams/{team}/members/", "team.view", 200),
    ("members-detail", "get", "/api/v1/teams/{team}/members/{viewer}/", "team.view", 200),
    ("members-add", "post", "/api/v1/teams/{team}/members/", "team.manage", 202),  # an invitation
    ("members-change", "patch", "/api/v1/teams/{team}/members/{viewer}/", "team.manage", 200),
    ("members-remove", "delete", "/api/v1/teams/{team}/members/{viewer}/", "team.manage", 204),
    ("limits-detail", "get", "/api/v1/teams/{team}/limits/", "team.view", 200),
    ("limits-change", "patch", "/api/v1/teams/{team}/limits/", "team.manage", 200),
    ("audit-list", "get", "/api/v1/audit/", "audit.view", 200),
    ("invitations-list", "get", "/api/v1/invitations/", "invitation.respond", 200),
    ("invitations-detail", "get", "/api/v1/invitations/{invitation}/", "invitation.respond", 200),
    ("invitations-accept", "post", "/api/v1/invitations/{invitation}/accept/", "invitation.respond", 200),
    ("invitations-decline", "post", "/api/v1/invitations/{invitation}/decline/", "invitation.respond", 204),
    ("subscriptions-list", "get", "/api/v1/subscriptions/", "team.view", 200),
    ("subscriptions-detail", "get", "/api/v1/subscriptions/{subscription}/", "team.view", 200),
    ("subscriptions-create-team", "post", "/api/v1/subscriptions/", "subscription.manage_team", 201),
    ("subscriptions-create-own", "post", "/api/v1/subscriptions/", "subscription.manage_own", 201),
    ("subscriptions-test", "post", "/api/v1/subscriptions/{subscription}/test/", "subscription.manage_team", 202),
    ("subscriptions-delete", "delete", "/api/v1/subscriptions/{subscription}/", "subscription.manage_team", 204),
]
JOB_BODY = {"name": "x", "command": ["python", "t.py"]}
SUBSCRIPTION_BODY = {"name": "x", "channel": "email", "email": "ops@example.com", "events": ["job.failed"]}
BODIES = {
    "jobs-create": JOB_BODY,
    "tokens-create": {"name": "laptop"},
    "members-add": {"username": "newbie", "role": Role.VIEWER},
    "members-change": {"role": Role.MEMBER},
    "limits-change": {"max_concurrent_gpus": 4},
    "subscriptions-create-team": {"scope": "team", **SUBSCRIPTION_BODY},
    "subscriptions-create-own": {"scope": "personal", **SUBSCRIPTION_BODY},
}
# A person's token and invitation are theirs alone: the row's {token} belongs to the
# member, its {invitation} (to the outsider's team) to the viewer.
OWNERS = {"token.manage": Role.MEMBER, "invitation.respond": Role.VIEWER}
WHO = [Role.VIEWER, Role.MEMBER, Role.ADMIN, "outsider", "anonymous"]
LIST_ENDPOINTS = {name for name, _, url, _, _ in ENDPOINTS if "{" not in url and name.endswith("-list")}
CREATE_ENDPOINTS = {"jobs-create", "tokens-create", "subscriptions-create-team", "subscriptions-create-own"}
TEAM_IN_BODY = {"jobs-create", "subscriptions-create-team", "subscriptions-create-own"}


def holds_somewhere(who, action):
    """The outsider is admin of their own team, so holds every action there."""
    return who == "outsider" or role_allows(who, action)


def expected_status(action, who, success, is_list, is_create=False):
    if who == "anonymous":
        return 401
    if action in OWNERS:
        return success if is_list or is_create or who == OWNERS[action] else 404
    if is_list or action == "price.view":
        # lists hide other teams' rows; one nobody may read in any team is refused
        return success if holds_somewhere(who, action) else 403
    if who == "outsider":
        # Another team's object does not exist for you; nor does a team named in a body.
        return 400 if is_create else 404
    return success if role_allows(who, action) else 403


def objects_of(setup):
    job = make_job(setup.team, setup.people[Role.MEMBER].user)
    instance = make_instance(job, registered=True).instance
    checkpoint = Checkpoint.objects.create(
        checkpoint_id="00000000-0000-4000-8000-000000000001", job=job, instance=instance, step=10, uri="/x",
        bytes=1, manifest_digest="d", committed_at="2026-01-01T00:00:00Z")
    interruption = InterruptionEvent.objects.create(instance=instance, kind="notice", source="aws_imds")
    make_person("newbie")
    member = setup.people[OWNERS["token.manage"]].user
    audit = record_audit(member, AuditAction.JOB_SUBMITTED, f"job:{job.pk}", team=setup.team)
    invitation = Invitation.objects.create(team=setup.other_team, user=setup.people[OWNERS["invitation.respond"]].user,
                                           role=Role.MEMBER, invited_by=setup.people["outsider"].user)
    subscription = Subscription.objects.create(team=setup.team, name="ops", channel="email", email="ops@example.com",
                                               events=["job.failed"])
    return {"subscription": subscription.pk, "invitation": invitation.pk, "job": job.pk, "instance": instance.pk, "checkpoint": checkpoint.pk, "interruption": interruption.pk,
            "team": setup.team.pk, "token": ApiToken.objects.get(user=member).pk, "audit": audit.pk,
            "viewer": setup.people[Role.VIEWER].user.username}


@pytest.mark.parametrize("who", WHO)
@pytest.mark.parametrize("name,method,url,action,success", ENDPOINTS, ids=[e[0] for e in ENDPOINTS])
def test_authorization_matrix(db, name, method, url, action, success, who):
    setup = make_team_with_members()
    ids = objects_of(setup)
    client = APIClient()
    if who != "anonymous":
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {setup.people[who].token}")
    body = {"team": setup.team.pk, **BODIES[name]} if name in TEAM_IN_BODY else BODIES.get(name)
    response = getattr(client, method)(url.format(**ids), body, format="json")
    expected = expected_status(action, who, success, name in LIST_ENDPOINTS, name in CREATE_ENDPOINTS)
    assert response.status_code == expected, response.content
    if name in LIST_ENDPOINTS and who == "outsider" and name != "prices-list":
        listed = {row["id"] for row in response.json()["results"]}
        key = name.removesuffix("-list").removesuffix("s")
        assert ids[key] not in listed, "another team's (or person's) row leaked into a list"


def test_creating_in_another_team_is_refused_as_in_an_unknown_team(db):
    setup = make_team_with_members()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {setup.people['outsider'].token}")
    response = client.post("/api/v1/jobs/", {"team": setup.team.pk, "name": "x", "command": ["a"]}, format="json")
    assert response.status_code == 400
    assert response.json()["errors"]["team"] == [f'Invalid pk "{setup.team.pk}" - object does not exist.']


def test_every_action_in_the_table_is_exercised():
    exercised = {action for _, _, _, action, _ in ENDPOINTS}
    assert set(PERMISSIONS) | OPEN_ACTIONS <= exercised
