"""The savings report in a real browser against a live gunicorn: from the team overview's
link to the report page, whose cumulative savings chart is drawn (Chart.js, from the API's
curve) and whose per-job rows carry the figures the job cost API gives."""

from __future__ import annotations

import pytest
import requests

from tests.costs import recorded
from tests.costs.history import make_history
from tests.e2e.browser import browser_page, chromium_missing, evidence_on_failure, log_in, with_password
from tests.factories import make_team_with_members

pytestmark = [pytest.mark.e2e, pytest.mark.store_incidental]


@pytest.fixture
def world(web_server, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # ORM calls between Playwright's steps
    missing = chromium_missing()
    assert missing is None, missing
    setup = make_team_with_members("report")
    viewer = setup.people["viewer"]
    with_password(viewer.user)
    hand, *_ = make_history(setup.team, setup.people["member"].user)
    run, _ = recorded.load(setup.team, setup.people["member"].user, recorded.read())
    return web_server, setup, [hand, run]


def test_the_report_page_draws_the_cumulative_savings_and_lists_each_job(world, tmp_path):
    server, setup, jobs = world
    viewer = setup.people["viewer"]
    api = {"Authorization": f"Bearer {viewer.token}"}
    with browser_page(server.url) as (page, errors, outside), evidence_on_failure(page, tmp_path / "evidence"):
        log_in(page, viewer.user)
        page.goto(f"/teams/{setup.team.pk}/")
        page.get_by_role("link", name="Savings report").click()
        page.get_by_label("From").fill("2026-01")
        page.get_by_label("to", exact=True).fill("2026-12")
        page.get_by_role("button", name="Show").click()
        page.wait_for_url("**/report/?from=2026-01&to=2026-12")

        # The chart exists, drew three lines from the curve's points, and ends at the totals.
        page.wait_for_function("() => window.respawnCharts && window.respawnCharts.savings")
        drawn = page.evaluate("""() => { const c = window.respawnCharts.savings;
            return {sets: c.data.datasets.map((d) => d.data.length), width: c.width, height: c.height,
                    lastSaved: c.data.datasets[2].data.at(-1).y}; }""")
        assert len(drawn["sets"]) == 3 and min(drawn["sets"]) > 10 and drawn["width"] > 300 and drawn["height"] > 100
        totals = page.locator("#report-totals [data-field=savings]").get_attribute("data-exact")
        assert drawn["lastSaved"] == pytest.approx(float(totals))
        assert page.locator("#savings-chart").bounding_box()["height"] > 100

        rows = page.locator("#jobs-table tbody tr[data-job]")
        assert rows.count() == len(jobs)
        for job in jobs:
            row = page.locator(f'#jobs-table tr[data-job="{job.pk}"]')
            cost = requests.get(f"{server.url}/api/v1/jobs/{job.pk}/cost/", headers=api, timeout=30).json()
            for field, key in (("spent", "spent"), ("savings", "savings"), ("on_demand_baseline", "on_demand_baseline")):
                assert row.locator(f"[data-field={field}]").get_attribute("data-exact") == cost[key]
            assert row.get_by_role("link").inner_text().startswith(f"#{job.pk} ")
        assert page.locator("#zones-table tbody tr").count() >= 3  # hand-1a, local-a, local-b

        csv_link = page.get_by_role("link", name="months (CSV)")
        with page.expect_download() as download:
            csv_link.click()
        assert download.value.suggested_filename.endswith("-months.csv")
    assert errors == [] and outside == []
