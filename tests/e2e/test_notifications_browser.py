"""The notifications page in a real browser against a live gunicorn and Celery worker:
a team admin subscribes a webhook, copies the secret shown once, sends a test message
and sees it delivered in the log, then a job's failure arrives signed and is logged too."""

from __future__ import annotations

import pytest
from django.db import transaction

from respawn_server.jobs.core import secret_env
from respawn_server.jobs.core.choices import JobStatus, Role
from respawn_server.jobs.core.choices import NotificationKind as Kind
from respawn_server.jobs.core.transitions import transition_job
from respawn_server.jobs.models import Subscription
from tests.conftest import WebServer, celery_worker, share_secrets_key, wait_until
from tests.e2e.browser import browser_page, chromium_missing, evidence_on_failure, log_in, with_password
from tests.factories import make_job, make_team_with_members
from tests.notify.receiver import Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.store_incidental]
LIVE_S = 20_000


@pytest.fixture
def stack(child_env, tmp_path, monkeypatch, settings):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # ORM calls between Playwright's steps
    missing = chromium_missing()
    assert missing is None, missing
    settings.NOTIFY = {**settings.NOTIFY, "ALLOW_PRIVATE": True}
    # The receiver listens on 127.0.0.1; this process opens what the web server seals.
    env = share_secrets_key({**child_env, "RESPAWN_NOTIFY_ALLOW_PRIVATE": "1"}, settings)
    web = WebServer(env, tmp_path / "web.log").start()
    worker = celery_worker(env, tmp_path / "worker.log").start()
    with Receiver() as receiver:
        yield web, worker, receiver
    worker.stop()
    web.stop()


def test_an_admin_subscribes_sends_a_test_and_reads_the_delivery_log(stack, tmp_path):
    from playwright.sync_api import expect

    web, worker, receiver = stack
    setup = make_team_with_members("e2e")
    admin = setup.people[Role.ADMIN].user
    with_password(admin)
    with browser_page(web.url) as (page, errors, outside), evidence_on_failure(page, tmp_path / "screenshots"):
        log_in(page, admin)
        page.get_by_role("link", name="Team overview").click()
        page.get_by_role("link", name="Notifications").click()
        expect(page.get_by_role("heading", name="e2e: notifications")).to_be_visible()

        page.get_by_label("Name").fill("ops hook")
        page.get_by_label("Scope").select_option("team")
        page.get_by_label("Channel").select_option("webhook")
        page.get_by_label("URL").fill("http://169.254.169.254/latest/meta-data/")
        page.get_by_label("Job failed (cause and log tail)").check()
        page.get_by_role("button", name="Subscribe").click()
        expect(page.get_by_role("alert").filter(has_text="link-local")).to_be_visible()  # refused, the reason shown
        assert not Subscription.objects.exists()

        page.get_by_label("Name").fill("ops hook")
        page.get_by_label("URL").fill(receiver.url("/ok/hook"))
        page.get_by_label("Job failed (cause and log tail)").check()
        page.get_by_role("button", name="Subscribe").click()
        secret = page.locator("#secret").inner_text().strip()
        stored = Subscription.objects.get().secret
        assert stored != secret and secret_env.unseal_value(stored) == secret  # sealed at rest
        receiver.secrets["/ok/hook"] = secret
        page.goto(f"/teams/{setup.team.pk}/notifications/")
        expect(page.get_by_role("heading", name="Delivery log")).to_be_visible()
        expect(page.locator("#secret")).to_have_count(0)  # shown once
        assert secret not in page.content()

        row = page.locator("tr[data-subscription='ops hook']")
        row.get_by_role("button", name="Send test").click()
        expect(page.get_by_text("Test message queued for ops hook")).to_be_visible()
        wait_until(lambda: receiver.at("/ok/hook"), timeout=LIVE_S / 1000, what="the test message", proc=worker)
        page.reload()
        logged = page.locator("#deliveries-table tr[data-kind='test']")
        expect(logged.locator("[data-field=status]")).to_have_text("sent")
        expect(logged).to_contain_text("HTTP 200")
        assert receiver.at("/ok/hook")[0].signature_ok is True

        job = make_job(setup.team, admin, name="e2e-crash", status=JobStatus.RUNNING,
                       failure_message="exit 1: ValueError: nan loss\nTraceback ...")
        with transaction.atomic():
            transition_job(job.pk, JobStatus.RUNNING, JobStatus.FAILED, message="failed the same way twice",
                           failure_cause="user_code")
        wait_until(lambda: len(receiver.at("/ok/hook")) == 2, timeout=LIVE_S / 1000, what="the failure", proc=worker)
        page.reload()
        failure = page.locator(f"#deliveries-table tr[data-kind='{Kind.JOB_FAILED}']")
        expect(failure).to_contain_text("e2e-crash")
        expect(failure.locator("[data-field=status]")).to_have_text("sent")
        failed = receiver.at("/ok/hook")[1]
        assert failed.signature_ok is True and "ValueError: nan loss" in failed.json()["text"]
        assert not errors and not outside
