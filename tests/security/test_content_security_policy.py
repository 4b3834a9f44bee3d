"""Every answer carries a Content-Security-Policy that lets a page run only our own
scripts and styles, and the API docs page serves Swagger UI from our own static
files (no CDN script running in the session's origin). In a real browser the
dashboard, the admin and the API docs work under that policy: no violation, no
script error, no request beyond the control plane."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from respawn_server.jobs.core.choices import Role
from respawn_server.jobs.money.seed_prices import seed_price_book
from tests.e2e.browser import browser_page, chromium_missing, evidence_on_failure, log_in, with_password
from tests.factories import make_job


def policy_of(response) -> dict[str, list[str]]:
    header = response.headers.get("Content-Security-Policy", "")
    return {name: sources for name, *sources in (part.split() for part in header.split(";") if part.strip())}


def test_every_answer_carries_a_policy_of_our_own_scripts_and_styles_only(team_setup):
    browser = Client()
    browser.force_login(team_setup.people[Role.ADMIN].user)
    job = make_job(team_setup.team, team_setup.people[Role.ADMIN].user)
    for path in ("/", f"/jobs/{job.pk}/", f"/jobs/{job.pk}/status.json", "/login/", "/admin/login/",
                 "/api/v1/jobs/", "/api/schema/", "/api/docs/", "/healthz", "/no-such-page/",
                 "/static/frontend/app.css"):
        policy = policy_of(browser.get(path))
        assert policy.get("script-src") == ["'self'"], (path, policy)
        assert policy.get("style-src") == ["'self'"], (path, policy)
        assert policy.get("object-src") == ["'none'"], (path, policy)
        assert policy.get("frame-ancestors") == ["'none'"], (path, policy)
        assert policy.get("default-src") == ["'self'"], (path, policy)


def test_the_api_docs_page_runs_only_our_own_static_files():
    page = Client().get("/api/docs/")
    html = page.content.decode()
    assert page.status_code == 200
    assert "cdn." not in html and "@latest" not in html, html
    assert not re.search(r"<script>|<style", html), "inline code the policy would refuse"
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert any("swagger-ui-bundle.js" in asset for asset in assets), assets
    for asset in assets:
        assert asset.startswith("/"), asset
        served = Client().get(asset)
        assert served.status_code == 200, asset
        assert served.headers["Content-Type"].split(";")[0] in ("application/javascript", "text/javascript",
                                                                "text/css", "image/png"), asset


@pytest.fixture
def staff_admin(team_setup):
    person = team_setup.people[Role.ADMIN]
    with_password(person.user)
    person.user.is_staff = person.user.is_superuser = True
    person.user.save(update_fields=["is_staff", "is_superuser"])
    return person


@pytest.mark.e2e
def test_dashboard_admin_and_api_docs_work_in_a_browser_under_the_policy(team_setup, staff_admin, web_server,
                                                                        monkeypatch, tmp_path):
    from playwright.sync_api import expect

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # ORM calls between Playwright's steps
    assert chromium_missing() is None, chromium_missing()
    seed_price_book()
    job = make_job(team_setup.team, staff_admin.user, env={"BATCH": "64"})
    team = team_setup.team.pk
    with browser_page(web_server.url) as (page, errors, outside), evidence_on_failure(page, tmp_path / "shots"):
        violations = []
        page.on("console", lambda message: violations.append(f"{page.url}: {message.text}")
                if "Content Security Policy" in message.text else None)
        log_in(page, staff_admin.user)
        expect(page.get_by_role("heading", name=f"Jobs of {team_setup.team.name}")).to_be_visible()

        page.goto(f"/jobs/{job.pk}/")
        # Chart.js sizes a canvas it has drawn on (through the CSSOM, which the policy allows).
        for chart in ("#timeline-chart", "#loss-chart", "#cost-chart"):
            expect(page.locator(chart)).to_have_attribute("style", re.compile("display: block"))
        for path, shows in ((f"/teams/{team}/", "Submit job"), (f"/teams/{team}/settings/", "Members"),
                            ("/prices/", "Prices"), ("/tokens/", "API tokens"), ("/admin/", "Site administration"),
                            ("/admin/jobs/job/", "Select job to change"),
                            (f"/admin/jobs/job/{job.pk}/change/", "Change job")):
            page.goto(path)
            expect(page.get_by_text(shows).first).to_be_visible()

        page.goto("/api/docs/")
        expect(page.locator(".swagger-ui .info .title")).to_contain_text("Respawn API")
        expect(page.locator(".swagger-ui .opblock").first).to_be_visible()
        page.locator(".swagger-ui .opblock-summary").first.click()  # an operation opens: the UI's scripts run
        expect(page.locator(".swagger-ui .opblock.is-open")).to_have_count(1)

        assert not violations, violations
        assert not errors, f"script errors on the pages: {errors}"
        assert not outside, f"a page asked for something beyond the control plane: {outside}"
