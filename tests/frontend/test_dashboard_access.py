"""Every dashboard page and JSON view × every role × own team / other team /
anonymous, with the expected answer derived from the ONE permission table."""

import pytest
from django.test import Client

from respawn_server.jobs.core.choices import Role
from respawn_server.jobs.models import Job
from respawn_server.jobs.people.permissions import role_allows
from tests.factories import make_job, make_team_with_members

# (name, method, url template, action, success status, kind) — kind: page | json | list
PAGES = [
    ("jobs-list", "get", "/", "job.view", 200, "list"),
    ("jobs-json", "get", "/jobs.json", "job.view", 200, "list-json"),
    ("job-page", "get", "/jobs/{job}/", "job.view", 200, "page"),
    ("job-json", "get", "/jobs/{job}/status.json", "job.view", 200, "json"),
    ("job-cancel", "post", "/jobs/{job}/cancel/", "job.cancel", 302, "page"),
    ("team-page", "get", "/teams/{team}/", "team.view", 200, "page"),
    ("team-json", "get", "/teams/{team}/status.json", "team.view", 200, "json"),
    ("team-submit", "post", "/teams/{team}/submit/", "job.create", 302, "page"),
    ("team-switch", "post", "/team/switch/", "team.view", 302, "page"),
    ("prices", "get", "/prices/", "price.view", 200, "list"),
]
WHO = [Role.VIEWER, Role.MEMBER, Role.ADMIN, "outsider", "anonymous"]
SUBMIT = {"name": "from-the-form", "command": "python train.py --lr 3e-4", "priority": "0", "total_steps": "100"}


def expected_status(action, who, success, kind):
    if who == "anonymous":
        return 401 if "json" in kind else 302  # pages send you to the login page
    if kind.startswith("list") or action == "price.view":
        return success  # lists show only your teams' rows
    if who == "outsider":
        return 404  # another team's object does not exist for you
    return success if role_allows(who, action) else 403


@pytest.mark.parametrize("who", WHO)
@pytest.mark.parametrize("name,method,url,action,success,kind", PAGES, ids=[p[0] for p in PAGES])
def test_dashboard_authorization_matrix(db, name, method, url, action, success, kind, who):
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people[Role.MEMBER].user, name="secret-vision-job")
    client = Client()
    if who != "anonymous":
        client.force_login(setup.people[who].user)
    body = {**SUBMIT, "team": setup.team.pk} if method == "post" else None
    response = getattr(client, method)(url.format(job=job.pk, team=setup.team.pk), body)
    assert response.status_code == expected_status(action, who, success, kind), response.content[:500]
    if who == "anonymous" and "json" not in kind:
        assert response["Location"].startswith("/login/")
    if kind.startswith("list") and who == "outsider":
        assert b"secret-vision-job" not in response.content, "another team's job leaked into a list"


def test_every_dashboard_action_is_in_the_permission_table():
    from respawn_server.jobs.people.permissions import OPEN_ACTIONS, PERMISSIONS

    assert {p[3] for p in PAGES} <= set(PERMISSIONS) | OPEN_ACTIONS


def test_the_submit_form_creates_the_job_the_api_would(db, settings):
    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": ["aws", "gcp"]}
    setup = make_team_with_members()
    client = Client()
    client.force_login(setup.people[Role.MEMBER].user)
    response = client.post(f"/teams/{setup.team.pk}/submit/", {**SUBMIT, "instance_types": "g5.xlarge, g6.xlarge",
                                                                "allowed_clouds": ["aws", "gcp"]})
    job = Job.objects.get(name="from-the-form")
    assert response["Location"] == f"/jobs/{job.pk}/"
    assert job.command == ["python", "train.py", "--lr", "3e-4"]
    assert (job.instance_types, job.allowed_clouds, job.owner) == (["g5.xlarge", "g6.xlarge"], ["aws", "gcp"],
                                                                   setup.people[Role.MEMBER].user)


def test_the_submit_form_shows_the_serializers_refusal_by_field(db):
    setup = make_team_with_members()
    client = Client()
    client.force_login(setup.people[Role.MEMBER].user)
    response = client.post(f"/teams/{setup.team.pk}/submit/", {**SUBMIT, "checkpoint_interval_s": "0"})
    assert response.status_code == 400
    assert b"Ensure this value is greater than or equal to 1" in response.content
    assert not Job.objects.filter(name="from-the-form").exists()


def test_a_viewer_sees_no_submit_form_and_no_cancel_button(db):
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people[Role.MEMBER].user)
    client = Client()
    client.force_login(setup.people[Role.VIEWER].user)
    assert b'id="submit-form"' not in client.get(f"/teams/{setup.team.pk}/").content
    assert client.get(f"/jobs/{job.pk}/status.json").json()["job"]["cancellable"] is False


def test_bad_filters_are_refused_by_name(db):
    setup = make_team_with_members()
    client = Client()
    client.force_login(setup.people[Role.VIEWER].user)
    response = client.get("/jobs.json?status=sleeping")
    assert response.status_code == 400 and "status" in response.json()["errors"]
    response = client.get(f"/teams/{setup.team.pk}/status.json?month=2026-13")
    assert response.status_code == 400 and "month" in response.json()["errors"]


def test_the_team_switcher_chooses_whose_jobs_are_listed(db):
    setup = make_team_with_members()
    second = make_team_with_members("audio")
    from respawn_server.jobs.models import Membership

    admin = setup.people[Role.ADMIN].user
    Membership.objects.create(user=admin, team=second.team, role=Role.VIEWER)
    make_job(second.team, second.people[Role.MEMBER].user, name="audio-job")
    make_job(setup.team, setup.people[Role.MEMBER].user, name="vision-job")
    client = Client()
    client.force_login(admin)
    client.post("/team/switch/", {"team": second.team.pk, "next": "/"})
    names = [row["name"] for row in client.get("/jobs.json").json()["rows"]]
    assert names == ["audio-job"]
