"""A signed-in browser session cannot be made to write by another site (CSRF on
the dashboard and on the API under session auth), and every answer carries the
security headers; HSTS and secure cookies are on when configured."""

from __future__ import annotations

import re

import requests
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.test import Client
from rest_framework.test import APIClient

from respawn_server.jobs.core.choices import JobStatus
from respawn_server.jobs.models import ApiToken, Job
from tests.api.clients import client_for
from tests.conftest import WebServer
from tests.factories import make_job


def signed_in(client, person):
    client.force_login(person.user)
    client.get("/")  # the dashboard sets the CSRF cookie, as a browser would get it
    return client, client.cookies["csrftoken"].value


def test_dashboard_cancel_without_the_csrf_token_is_403_and_cancels_nothing(team_setup):
    job = make_job(team_setup.team, team_setup.people["admin"].user)
    browser, csrf = signed_in(Client(enforce_csrf_checks=True), team_setup.people["admin"])
    assert browser.post(f"/jobs/{job.pk}/cancel/").status_code == 403
    assert Job.objects.get(pk=job.pk).status == JobStatus.QUEUED
    assert browser.post(f"/jobs/{job.pk}/cancel/", HTTP_X_CSRFTOKEN=csrf).status_code == 302
    assert Job.objects.get(pk=job.pk).status != JobStatus.QUEUED


def test_api_write_with_a_session_needs_the_csrf_token(team_setup):
    person = team_setup.people["member"]
    browser, csrf = signed_in(APIClient(enforce_csrf_checks=True), person)
    refused = browser.post("/api/v1/tokens/", {"name": "forged"}, format="json")
    assert refused.status_code == 403
    assert "CSRF" in refused.json()["detail"]
    assert not ApiToken.objects.filter(name="forged").exists()
    assert browser.get("/api/v1/tokens/").status_code == 200  # reads need no token
    made = browser.post("/api/v1/tokens/", {"name": "mine"}, format="json", HTTP_X_CSRFTOKEN=csrf)
    assert made.status_code == 201


def test_a_bearer_token_write_needs_no_csrf_token(team_setup):
    # A token is not sent by a browser on its own, so it cannot be forged cross-site.
    client = client_for(team_setup.people["member"])
    client.handler.enforce_csrf_checks = True
    assert client.post("/api/v1/tokens/", {"name": "script"}, format="json").status_code == 201


def test_pages_api_and_health_answers_carry_the_security_headers(team_setup):
    browser, _ = signed_in(Client(), team_setup.people["admin"])
    job = make_job(team_setup.team, team_setup.people["admin"].user)
    for path in ("/", f"/jobs/{job.pk}/", "/login/", "/api/v1/jobs/", "/healthz", "/api/schema/"):
        headers = browser.get(path).headers
        assert headers["X-Content-Type-Options"] == "nosniff", path
        assert headers["Referrer-Policy"] == "same-origin", path
        assert headers["X-Frame-Options"] == "DENY", path


def test_hsts_and_secure_cookies_when_configured(team_setup, child_env, tmp_path):
    env = {**child_env, "DJANGO_HSTS_SECONDS": "31536000", "DJANGO_SECURE_COOKIES": "true"}
    # The server checks passwords with the production hashers, not the tests' fast one.
    admin = team_setup.people["admin"].user
    admin.password = PBKDF2PasswordHasher().encode("correct horse battery", "securitytestsalt")
    admin.save(update_fields=["password"])
    server = WebServer(env, tmp_path / "web.log").start()
    try:
        https = {"X-Forwarded-Proto": "https"}  # as the TLS-terminating proxy says
        health = requests.get(server.url + "/healthz", headers=https, timeout=10)
        assert health.headers["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains; preload"
        login_page = requests.get(server.url + "/login/", headers=https, timeout=10)
        csrf = login_page.cookies["csrftoken"]
        # By hand: requests keeps a Secure cookie off a plain-HTTP URL, the proxy's side of TLS here.
        signed = requests.post(server.url + "/login/", headers={
            **https, "Referer": server.url.replace("http:", "https:") + "/login/", "Cookie": f"csrftoken={csrf}",
        }, data={"username": "vision-admin", "password": "correct horse battery", "csrfmiddlewaretoken": csrf},
            allow_redirects=False, timeout=10)
    finally:
        server.stop()
    assert re.search(r"csrftoken=[^;]+;.*\bSecure\b", login_page.headers["Set-Cookie"])
    assert signed.status_code == 302, signed.text[:500]
    assert re.search(r"sessionid=[^;]+;.*\bHttpOnly\b.*\bSecure\b", signed.headers["Set-Cookie"])


def test_without_tls_configuration_no_hsts_is_sent(team_setup):
    # The laptop default serves plain HTTP; HSTS there would lock the browser out.
    assert "Strict-Transport-Security" not in Client().get("/healthz", secure=True).headers
