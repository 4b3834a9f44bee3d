"""The job page tells the story, in a real browser against a live gunicorn (issue 21
item 4): a loss curve from every reported step with its resume and preemption, the log
from its first line, the checkpoint interval in words, job ids in the list, only the
configured clouds on the submit form, spot beside on-demand on the prices page, a long
artifact path shown whole with a button that copies it, and a favicon."""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import time

import pytest
import requests

from respawn import protocol
from respawn_server.jobs.core.choices import JobStatus, Role
from respawn_server.jobs.models import Checkpoint, Job
from tests.e2e.browser import browser_page, evidence_on_failure, log_in
from tests.e2e.test_dashboard_browser import LIVE_S, Agent, dashboard, now_iso  # noqa: F401 (a fixture)
from tests.factories import make_instance, make_job

pytestmark = [pytest.mark.e2e, pytest.mark.store_incidental]
CONFIGURED = ["local", "gcp"]
T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)


@pytest.fixture
def configured(child_env):
    """The live server launches on these clouds only (set before the server starts)."""
    child_env["RESPAWN_PROVIDERS"] = ",".join(CONFIGURED)
    return CONFIGURED


@contextlib.contextmanager
def signed_in(live):
    """A browser page signed in as the team's member; no script error and no request beyond
    the control plane by the end of the block (a screenshot kept if it fails)."""
    from playwright.sync_api import expect

    server, setup, shots = live
    with browser_page(server.url) as (page, errors, outside), evidence_on_failure(page, shots):
        log_in(page, setup.people[Role.MEMBER].user)
        expect(page.get_by_role("heading", name=re.compile("^Jobs"))).to_be_visible()
        yield page
        assert not errors and not outside, (errors, outside)


def settle(page, script: str, wanted):
    """Poll `script`'s value in the page until it is `wanted` (the page's CSP forbids the eval
    that Playwright's wait_for_function does); the value it last had otherwise."""
    deadline = time.monotonic() + LIVE_S / 1000
    while (value := page.evaluate(script)) != wanted and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    assert value == wanted, f"{script} is {value!r}, not {wanted!r}"


def steps(first: int, last: int) -> list[protocol.StepMetric]:
    return [protocol.StepMetric(step=s, time=(T0 + dt.timedelta(seconds=s)).isoformat(), loss=3.0 / s,
                                samples_per_s=100.0) for s in range(first, last + 1)]


def running_job(url: str, setup, **fields) -> tuple[Job, Agent, int]:
    job = make_job(setup.team, setup.people[Role.MEMBER].user, status=JobStatus.PROVISIONING, **fields)
    return job, *registered(url, job)


def registered(url: str, job) -> tuple[Agent, int]:
    """A new VM of `job` whose agent registered with the live server: its agent, its instance's id."""
    vm = make_instance(job)
    agent = Agent(url)
    agent.register(vm.bootstrap_token)
    return agent, vm.instance.pk


@pytest.fixture
def live(dashboard, tmp_path):  # noqa: F811 (the fixture imported above)
    server, setup = dashboard
    return server, setup, tmp_path / "screenshots"


def test_the_loss_curve_has_every_step_with_the_preemption_and_the_resume_marked(live):
    from playwright.sync_api import expect

    server, setup, _ = live
    job, first, first_id = running_job(server.url, setup)
    for start in (1, 101):  # two heartbeats' worth of steps: 150 points, not two
        first.post(protocol.PATH_METRICS, protocol.MetricsBatch(points=steps(start, min(start + 99, 150))))
    first.post(protocol.PATH_HEARTBEAT, protocol.Heartbeat(step=150, loss=0.02))
    checkpoint = protocol.CheckpointReport(checkpoint_id="0b7e4a7e-0000-4000-8000-000000000100", step=100,
                                           uri=f"{first.checkpoint_uri}/step-00000100", bytes=1, manifest_digest="x:1",
                                           committed_at=now_iso(), tiers=["storage", "memory"])
    first.post(protocol.PATH_CHECKPOINTS, checkpoint)
    first.post(protocol.PATH_NOTICE, protocol.Notice(source="local", notice_time=now_iso(), deadline=now_iso(25)))
    first.post(protocol.PATH_EXIT, protocol.ExitReport(reason=protocol.ExitReason.PREEMPTED, final_step=150))
    Job.objects.filter(pk=job.pk).update(status=JobStatus.PROVISIONING)
    second, second_id = registered(server.url, job)
    assert Checkpoint.objects.get(step=100).instance_id == first_id
    second.post(protocol.PATH_METRICS, protocol.MetricsBatch(points=steps(101, 180)))
    with signed_in(live) as page:
        page.goto(f"/jobs/{job.pk}/")
        drawn = "respawnCharts.loss && respawnCharts.loss.data.datasets[0].data.filter(p => p.y !== null).length"
        settle(page, drawn, 230)
        marks = page.evaluate("Object.fromEntries(respawnCharts.loss.data.datasets.slice(1)"
                              ".map(d => [d.label, d.data.map(p => p.x)]))")
        assert marks == {"resumes": [100], "preemptions": [150], "lost": []}
        gaps = page.evaluate("respawnCharts.loss.data.datasets[0].data.filter(p => p.y === null).length")
        assert gaps == 1, "the resumed run is drawn as a line of its own"
        # More steps arrive: drawn in place, without a reload.
        page.evaluate("window.__sameDocument = true")
        second.post(protocol.PATH_METRICS, protocol.MetricsBatch(points=steps(181, 200)))
        settle(page, drawn, 250)
        assert page.evaluate("window.__sameDocument") is True
        expect(page.get_by_text("resumed from a checkpoint")).to_be_visible()
        # Where the step was held as it committed, as its manifest records.
        expect(page.locator('#checkpoints-table tr[data-step="100"] td[data-field="tiers"]')).to_have_text("storage + memory")


def test_the_log_streams_from_its_first_line_with_the_resume_told(live):
    server, setup, _ = live
    job, agent, instance_id = running_job(server.url, setup)
    told = f"[respawn-agent] 2026-03-01T00:00:00+00:00 resumed from step 400 (checkpoint {agent.checkpoint_uri}" \
           "/step-00000400, validated)"
    agent.post(protocol.PATH_LOGS, protocol.LogBatch(offset=0, lines=[told]))
    for batch in range(3):  # 3000 lines: far more than a tail
        agent.post(protocol.PATH_LOGS, protocol.LogBatch(
            offset=1 + 1000 * batch, lines=[f"step {n}" for n in range(1000 * batch, 1000 * (batch + 1))]))
    with signed_in(live) as page:
        page.goto(f"/jobs/{job.pk}/")
        settle(page, "document.getElementById('log').textContent.split('\\n').length", 3001)
        lines = page.evaluate("document.getElementById('log').textContent.split('\\n')")
        assert lines[0] == f"[{instance_id}] {told}" and lines[1] == f"[{instance_id}] step 0"
        assert lines[-1] == f"[{instance_id}] step 2999"
        page.evaluate("window.__sameDocument = true")
        agent.post(protocol.PATH_LOGS, protocol.LogBatch(offset=3001, lines=["step 3000"]))
        settle(page, "document.getElementById('log').textContent.endsWith('] step 3000')", True)
        assert page.evaluate("document.getElementById('log').textContent.split('\\n').length") == 3002
        assert page.evaluate("window.__sameDocument") is True


def test_the_checkpoint_interval_is_explained_in_words(live):
    from playwright.sync_api import expect

    server, setup, _ = live
    job, _agent, _ = running_job(server.url, setup)  # registering gives the instance its interval
    with signed_in(live) as page:
        page.goto(f"/jobs/{job.pk}/")
        interval = page.locator("#interval")
        expect(interval).to_have_text(re.compile(
            r"^Checkpoints every \d+ min( \d+ s)?: measured save cost [\d.]+ s, .* on spot in local-a \(.+\)\. "))
        assert not re.search(r"\bM = \d", interval.inner_text()) and "19681817" not in interval.inner_text()


def test_the_jobs_list_shows_each_jobs_id(live):
    from playwright.sync_api import expect

    _, setup, _ = live
    older = make_job(setup.team, setup.people[Role.MEMBER].user, name="same-name")
    newer = make_job(setup.team, setup.people[Role.MEMBER].user, name="same-name")
    with signed_in(live) as page:
        expect(page.locator("#jobs-table thead th").first).to_have_text("ID")
        for job in (older, newer):
            expect(page.locator(f'tr[data-job="{job.pk}"] [data-field="id"]')).to_have_text(str(job.pk))
        # The live refresh keeps the column: a new job redraws the rows from jobs.json.
        added = make_job(setup.team, setup.people[Role.MEMBER].user, name="same-name")
        expect(page.locator(f'tr[data-job="{added.pk}"] td').first).to_have_text(str(added.pk), timeout=LIVE_S)


def test_the_submit_form_offers_only_the_configured_clouds(configured, live):
    from playwright.sync_api import expect

    with signed_in(live) as page:
        page.get_by_role("link", name="Team overview").click()
        clouds = page.get_by_role("group", name="Allowed clouds").get_by_role("checkbox")
        expect(clouds).to_have_count(len(configured))
        assert sorted(clouds.evaluate_all("boxes => boxes.map(b => b.value)")) == sorted(configured)
        expect(page.get_by_label("aws", exact=True)).to_have_count(0)


def test_prices_show_spot_beside_on_demand_what_launches_here_first(configured, live):
    from playwright.sync_api import expect

    with signed_in(live) as page:
        page.get_by_role("link", name="Prices").click()
        table = page.locator("#prices-table")
        expect(table.locator("thead th")).to_contain_text(["Spot USD / hour", "On-demand USD / hour", "Spot discount"])
        clouds = table.locator("tbody tr[data-cloud]").evaluate_all(
            "rows => rows.map(r => [r.dataset.cloud, r.dataset.launchable])")
        launchable = [cloud for cloud, here in clouds if here == "yes"]
        assert launchable and set(launchable) <= set(configured)
        first_other = next(i for i, (_, here) in enumerate(clouds) if here == "no")
        assert all(here == "yes" for _, here in clouds[:first_other]), "what launches here comes first"
        gcp = table.locator('tbody tr[data-cloud="gcp"]').filter(has_not_text="–").first
        spot = float(gcp.locator('[data-field="spot"]').inner_text())
        on_demand = float(gcp.locator('[data-field="on-demand"]').inner_text())
        discount = int(gcp.locator('[data-field="discount"]').inner_text().rstrip("%"))
        assert 0 < spot < on_demand and discount == round(100 * (1 - spot / on_demand))


def test_a_long_artifact_path_is_shown_whole_and_copied_with_one_click(live):
    _, setup, _ = live
    uri = "s3://team-bucket/" + "/".join(f"very-long-directory-name-{n}" for n in range(15)) + "/model.safetensors"
    job = make_job(setup.team, setup.people[Role.MEMBER].user, status=JobStatus.SUCCEEDED, artifact_uri=uri,
                   artifact_digest="sha256:" + "ab" * 32)
    with signed_in(live) as page:
        page.context.grant_permissions(["clipboard-read", "clipboard-write"])
        page.goto(f"/jobs/{job.pk}/")
        artifact = page.locator('.figures [data-field="artifact"]')
        settle(page, "document.querySelector('.figures [data-field=artifact-digest]').textContent.includes('sha256')",
               True)
        assert artifact.inner_text() == uri
        assert not artifact.evaluate("code => code.scrollWidth > code.clientWidth"), "the path is cut"
        cards = page.locator(".figures > div:not(.wide):not([hidden])").evaluate_all(
            "cards => cards.map(c => c.getBoundingClientRect().width)")
        assert len({round(w) for w in cards}) == 1, f"the other cards keep one width: {cards}"
        page.get_by_role("button", name="Copy path").click()
        assert page.evaluate("navigator.clipboard.readText()") == uri


def test_every_page_has_a_favicon(live):
    server, _, _ = live
    with signed_in(live) as page:
        href = page.locator('link[rel="icon"]').get_attribute("href")
        assert href.endswith(".svg")
        icon = requests.get(server.url + href, timeout=10)
        assert icon.status_code == 200 and icon.headers["Content-Type"].startswith("image/svg+xml")
        assert icon.text.lstrip().startswith("<svg")
        page.goto("/prices/")
        assert page.locator('link[rel="icon"]').get_attribute("href") == href
