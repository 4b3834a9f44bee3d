"""The dashboard in a real browser against a live gunicorn: log in, submit a job
from the form, find it in the list, watch it go running and a preemption appear
on its timeline without a reload, and read the API's savings on the page."""

from __future__ import annotations

import datetime as dt
import re
import uuid
from decimal import Decimal

import pytest
import requests

from respawn import protocol
from respawn.vocabulary.money import money_figures
from respawn_server.jobs.core.choices import JobStatus, Role
from respawn_server.jobs.core.transitions import transition_job
from respawn_server.jobs.models import Job
from respawn_server.jobs.money.seed_prices import seed_price_book
from tests.e2e.browser import browser_page, chromium_missing, evidence_on_failure, log_in, with_password
from tests.factories import make_instance, make_team_with_members

pytestmark = [pytest.mark.e2e, pytest.mark.store_incidental]
LIVE_S = 20_000  # ms a live update may take: two polls plus a slow CI machine


@pytest.fixture
def dashboard(web_server, monkeypatch):
    # Playwright's sync API runs an event loop in this thread; the ORM calls the
    # test makes between browser steps are still plain synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    missing = chromium_missing()
    assert missing is None, missing
    seed_price_book()
    setup = make_team_with_members("e2e")
    with_password(setup.people[Role.MEMBER].user)
    return web_server, setup


class Agent:
    """Speaks the agent API to the live server, as a VM's agent would."""

    def __init__(self, base_url: str):
        self.base, self.token = base_url + protocol.API_PREFIX, None

    def post(self, path: str, report) -> dict:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        response = requests.post(self.base + path, json=protocol.to_dict(report), headers=headers, timeout=10)
        assert response.ok, (path, response.status_code, response.text)
        return response.json()

    def register(self, bootstrap_token: str):
        answer = self.post(protocol.PATH_REGISTER, protocol.Register(bootstrap_token=bootstrap_token))
        self.token, self.checkpoint_uri = answer["agent_token"], answer["job"]["checkpoint_uri"]


def now_iso(offset_s: float = 0) -> str:
    return (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=offset_s)).isoformat()


def test_a_job_from_the_form_to_a_preemption_on_its_timeline(dashboard, tmp_path):
    from playwright.sync_api import expect

    server, setup = dashboard
    member = setup.people[Role.MEMBER]
    with browser_page(server.url) as (page, errors, outside), evidence_on_failure(page, tmp_path / "screenshots"):
        log_in(page, member.user)
        expect(page.get_by_role("heading", name="Jobs of e2e")).to_be_visible()

        page.get_by_role("link", name="Team overview").click()
        page.get_by_label("Name").fill("e2e-train")
        page.get_by_label("Command").fill("python train.py --steps 1000")
        page.get_by_label("Total steps").fill("1000")
        page.get_by_label("local").check()
        page.get_by_role("button", name="Submit job").click()
        expect(page.get_by_role("heading", name="e2e-train")).to_be_visible()
        job = Job.objects.get(name="e2e-train")
        assert (job.owner, job.command, job.total_steps) == (member.user, ["python", "train.py", "--steps", "1000"],
                                                              1000)

        page.get_by_role("link", name="Jobs", exact=True).click()
        row = page.locator(f'tr[data-job="{job.pk}"]')
        expect(row).to_contain_text("queued")
        page.evaluate("window.__sameDocument = true")
        transition_job(job.pk, JobStatus.QUEUED, JobStatus.PROVISIONING, message="placing on local")
        expect(row.locator("[data-field=status]")).to_contain_text("placing on local", timeout=LIVE_S)
        assert page.evaluate("window.__sameDocument") is True, "the list reloaded instead of updating in place"
        row.get_by_role("link", name="e2e-train").click()
        page.evaluate("window.__sameDocument = true")

        # The cloud gives the job a VM; its agent registers and reports.
        vm = make_instance(job)
        agent = Agent(server.url)
        agent.register(vm.bootstrap_token)
        expect(page.locator("#job-summary [data-field=status]")).to_have_text("running", timeout=LIVE_S)

        agent.post(protocol.PATH_HEARTBEAT, protocol.Heartbeat(step=0, loss=2.5))
        agent.post(protocol.PATH_LOGS, protocol.LogBatch(offset=0, lines=["epoch 1: loss 2.5"]))
        agent.post(protocol.PATH_CHECKPOINTS, protocol.CheckpointReport(
            checkpoint_id=str(uuid.uuid4()), step=40, uri=f"{agent.checkpoint_uri}/step-00000040", bytes=1024, manifest_digest="xxh3:1",
            committed_at=now_iso(), stall_s=0.2))
        agent.post(protocol.PATH_HEARTBEAT, protocol.Heartbeat(step=50, loss=1.5))
        expect(page.locator("#log")).to_contain_text("epoch 1: loss 2.5", timeout=LIVE_S)
        expect(page.locator('#timeline-table tr[data-kind="checkpoint"]')).to_have_count(1, timeout=LIVE_S)

        agent.post(protocol.PATH_NOTICE, protocol.Notice(source=protocol.NoticeSource.LOCAL, notice_time=now_iso(),
                                                         deadline=now_iso(25)))
        agent.post(protocol.PATH_EXIT, protocol.ExitReport(reason=protocol.ExitReason.PREEMPTED, final_step=50))
        expect(page.locator('#timeline-table tr[data-kind="notice"]')).to_have_count(1, timeout=LIVE_S)
        expect(page.locator('#timeline-table tr[data-kind="preempted"]')).to_have_count(1, timeout=LIVE_S)
        marks = page.evaluate("respawnCharts.timeline.data.datasets.find(d => d.label === 'preemptions').data.length")
        assert marks == 1, "the preemption is marked on the timeline chart itself"
        expect(page.locator("#job-summary [data-field=status]")).to_have_text("recovering", timeout=LIVE_S)
        assert page.evaluate("window.__sameDocument") is True, "the page reloaded instead of updating in place"

        # Every instance has ended, so the money is settled: the page shows what the API says.
        api = requests.get(f"{server.url}/api/v1/jobs/{job.pk}/cost/",
                           headers={"Authorization": f"Bearer {member.token}"}, timeout=10).json()
        savings = page.locator("#job-savings")
        expect(savings).to_have_attribute("data-exact", api["savings"], timeout=LIVE_S)
        # Seconds of a local VM cost a fraction of a cent: shown as such, with the share saved.
        assert 0 < Decimal(api["spent"]) < Decimal("0.01"), api
        spent = page.locator('.figures [data-field="spent"]')
        expect(spent).to_have_text(re.compile(r"^\$0\.00[0-9]*[1-9]$"))
        shown = money_figures(api["spent"], api["savings"], api["on_demand_baseline"])  # they add up as read
        expect(spent).to_have_text(shown["spent"])
        expect(savings).to_have_text(shown["savings"])
        # Cancelling from the page: a POST carrying the CSRF token, the status follows in place.
        page.once("dialog", lambda dialog: dialog.accept())
        page.get_by_role("button", name="Cancel job").click()
        expect(page.locator("#job-summary [data-field=status]")).to_have_text("cancelled", timeout=LIVE_S)
        expect(page.get_by_role("button", name="Cancel job")).to_be_hidden()
        assert page.evaluate("window.__sameDocument") is True

        assert not errors, f"script errors on the page: {errors}"
        assert not outside, f"the page asked for something beyond the control plane: {outside}"


def test_an_elastic_gangs_world_size_falls_on_its_chart_without_a_reload(dashboard, tmp_path):
    """A 3-node elastic job drawn at 3; a node lost, the chart steps down to 2 in place."""
    from playwright.sync_api import expect

    from respawn_server.jobs.core.choices import InstanceState
    from respawn_server.jobs.fleet.reconciler import _end_gone
    from respawn_server.jobs.models import Instance, WorldSize
    from tests.conftest import wait_until
    from tests.factories import make_job

    server, setup = dashboard
    member = setup.people[Role.MEMBER]
    job = make_job(setup.team, member.user, name="elastic", nodes=3, nodes_min=2, status=JobStatus.RUNNING)
    WorldSize.objects.create(job=job, world_size=3, reason="3 node(s) placed")
    nodes = [make_instance(job, rank=rank, state=InstanceState.RUNNING).instance for rank in range(3)]
    sizes = "respawnCharts.worldSize.data.datasets[0].data.map(p => p.y)"
    with browser_page(server.url) as (page, errors, outside), evidence_on_failure(page, tmp_path / "screenshots"):
        log_in(page, member.user)
        page.goto(f"/jobs/{job.pk}/")
        expect(page.get_by_role("heading", name="World size")).to_be_visible()
        drawn = f"window.respawnCharts && respawnCharts.worldSize ? {sizes} : null"
        wait_until(lambda: page.evaluate(drawn) == [3, 3], timeout=LIVE_S / 1000, what="3 nodes from placing to now")
        page.evaluate("window.__sameDocument = true")
        _end_gone(Instance.objects.get(pk=nodes[1].pk), "the cloud says gone")
        wait_until(lambda: page.evaluate(drawn) == [3, 2, 2], timeout=LIVE_S / 1000, what="the chart to step down to 2")
        assert page.evaluate("window.__sameDocument") is True
        assert errors == [] and outside == []
