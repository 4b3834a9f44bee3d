"""The Django admin site x every team role, an outsider, anonymous and staff: only
deployment staff get in. A team role, even admin, is no key to the admin site,
through a signed-in session or an API token; staff without a model's permissions
see the site but not that model."""

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from respawn_server.jobs.core.choices import Role
from tests.factories import make_job, make_person, make_team_with_members

PAGES = ["/admin/", "/admin/jobs/job/", "/admin/jobs/job/{job}/change/", "/admin/auth/user/"]
TEAM_PEOPLE = [Role.VIEWER, Role.MEMBER, Role.ADMIN, "outsider"]


def admin_pages(job) -> list[str]:
    return [page.format(job=job.pk) for page in PAGES]


@pytest.fixture
def world(db):
    setup = make_team_with_members()
    return setup, make_job(setup.team, setup.people[Role.MEMBER].user)


def refused_to_login(response, page: str) -> bool:
    return response.status_code == 302 and response.headers["Location"] == f"/admin/login/?next={page}"


@pytest.mark.parametrize("who", [*TEAM_PEOPLE, "anonymous"])
def test_no_team_role_gets_into_the_admin_site_with_a_session(world, who):
    setup, job = world
    browser = Client()
    if who != "anonymous":
        browser.force_login(setup.people[who].user)
    for page in admin_pages(job):
        response = browser.get(page)
        assert refused_to_login(response, page), (who, page, response.status_code)
    signed_in = browser.get("/admin/login/")
    assert b"Site administration" not in signed_in.content


@pytest.mark.parametrize("who", TEAM_PEOPLE)
def test_no_team_role_gets_into_the_admin_site_with_an_api_token(world, who):
    setup, job = world
    browser = Client(HTTP_AUTHORIZATION=f"Bearer {setup.people[who].token}")
    for page in admin_pages(job):
        assert refused_to_login(browser.get(page), page), (who, page)


@pytest.mark.parametrize("who", TEAM_PEOPLE)
def test_a_team_persons_password_does_not_sign_in_to_the_admin_site(world, who):
    setup, job = world
    browser = Client()
    answer = browser.post("/admin/login/?next=/admin/", {"username": setup.people[who].user.username,
                                                          "password": "correct horse battery"})
    assert answer.status_code == 200 and b"staff account" in answer.content, who
    assert refused_to_login(browser.get("/admin/jobs/job/"), "/admin/jobs/job/")


def test_staff_without_model_permissions_see_the_site_but_not_the_models(world):
    _, job = world
    staff = make_person("ops").user
    staff.is_staff = True
    staff.save(update_fields=["is_staff"])
    browser = Client()
    browser.force_login(staff)
    assert browser.get("/admin/").status_code == 200
    for page in admin_pages(job)[1:]:
        assert browser.get(page).status_code == 403, page
    staff.user_permissions.add(Permission.objects.get(codename="view_job"))
    assert browser.get("/admin/jobs/job/").status_code == 200
    assert browser.get("/admin/auth/user/").status_code == 403


def test_a_superuser_reaches_every_admin_page(world):
    _, job = world
    root = make_person("root").user
    root.is_staff = root.is_superuser = True
    root.save(update_fields=["is_staff", "is_superuser"])
    browser = Client()
    browser.force_login(root)
    for page in admin_pages(job):
        assert browser.get(page).status_code == 200, page
