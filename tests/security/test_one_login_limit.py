"""Every door that checks a password (the API's token endpoint the CLI signs in
with, the dashboard's sign-in, the Django admin's) counts against ONE limit per
client address, and that limit holds across gunicorn's worker processes on the
embedded default (SQLite) as on PostgreSQL: it is counted in the database."""

from __future__ import annotations

import re

import requests
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from tests.conftest import WebServer

LOGIN_LIMIT = 20  # settings: "login": "20/min"
RIGHT = "correct horse battery"


def superuser() -> User:
    return User.objects.create_superuser("root", password=RIGHT)


def test_the_admin_sign_in_is_refused_after_the_limit_even_with_the_right_password(db):
    superuser()
    page = Client()
    for _ in range(LOGIN_LIMIT):
        assert page.post("/admin/login/", {"username": "root", "password": "wrong"}).status_code == 200
    refused = page.post("/admin/login/", {"username": "root", "password": RIGHT})
    assert refused.status_code == 429
    assert "Too many sign-in attempts" in refused.content.decode()
    assert page.get("/admin/").status_code == 302  # still signed out: to the sign-in page


def test_guesses_through_every_door_count_against_one_limit(db):
    superuser()
    api, dashboard, admin = APIClient(), Client(), Client()
    doors = [
        lambda password: api.post("/api/v1/auth/token/", {"username": "root", "password": password}, format="json"),
        lambda password: dashboard.post("/login/", {"username": "root", "password": password}),
        lambda password: admin.post("/admin/login/", {"username": "root", "password": password}),
    ]
    for n in range(LOGIN_LIMIT):
        assert doors[n % 3]("wrong").status_code in (200, 401)
    assert [door(RIGHT).status_code for door in doors] == [429, 429, 429]


def admin_sign_in(url: str, password: str) -> int:
    """One sign-in through the admin's form, as a browser does it: its page (for the
    CSRF cookie), then the post, each on a fresh connection so both workers take turns."""
    session = requests.Session()
    session.headers["Connection"] = "close"
    form = session.get(url + "/admin/login/", timeout=10).text
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    return session.post(url + "/admin/login/", data={"username": "root", "password": password,
                                                     "csrfmiddlewaretoken": token}, timeout=10,
                        allow_redirects=False).status_code


def api_sign_in(url: str, password: str) -> int:
    return requests.post(url + "/api/v1/auth/token/", json={"username": "root", "password": password},
                         headers={"Connection": "close"}, timeout=10).status_code


def test_the_limit_holds_across_two_gunicorn_workers_and_both_doors(child_env, tmp_path):
    superuser()
    # The CSRF cookie over plain HTTP, as `make demo` serves it.
    server = WebServer({**child_env, "DJANGO_SECURE_COOKIES": "0"}, tmp_path / "web.log")
    server.argv[server.argv.index("--workers") + 1] = "2"
    server.start()
    try:
        doors = [api_sign_in, admin_sign_in]
        answers = [doors[n % 2](server.url, "wrong") for n in range(LOGIN_LIMIT + 4)]
        last = [door(server.url, RIGHT) for door in doors]
        workers = set(re.findall(r"Booting worker with pid: (\d+)", server.output()))
    finally:
        server.stop()
    assert len(workers) == 2
    assert answers[:LOGIN_LIMIT] == [401, 200] * (LOGIN_LIMIT // 2)
    assert answers[LOGIN_LIMIT:] == [429] * 4
    assert last == [429, 429]
