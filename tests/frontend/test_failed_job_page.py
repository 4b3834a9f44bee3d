"""A failed job says why at the top of its page and in the API: its cause and the last
exception line of the crash, whole, from what a real crashing training script printed
and the agent's own reading of it; its events are not cut mid-message either."""

import dataclasses
import subprocess
import sys
import uuid

import pytest
from django.test import Client
from django.utils.html import escape

from respawn import protocol
from respawn.agent.channel import last_exception_line, output_tail
from respawn.agent.ending import MAX_EXCEPTION_CHARS
from respawn_server.jobs.core.choices import JobStatus
from respawn_server.jobs.models import Job
from tests.agent_api.helpers import AgentClient
from tests.api.clients import client_for
from tests.factories import make_instance, make_job, make_team_with_members

# Progress lines enough to fill the agent's output tail, then a crash whose one-line
# message is long, as shape and state_dict errors are.
CRASHING_TRAINER = """
for step in range(1, 400):
    print(f"step {step} loss {2.3 / step:.5f} samples/s 1234.5 lr 3.0e-04 grad_norm 0.8123", flush=True)
sizes = {f"layer{i}.weight": [64 * (i % 4 + 1), 3, 3, 3] for i in range(13)}
raise ValueError(f"checkpoint does not fit the model: unexpected shapes {sizes}")
"""


def crash_report(tmp_path) -> protocol.ExitReport:
    """The exit report the agent makes of a trainer that crashed (respawn.agent.ending.exit_report)."""
    log = tmp_path / "trainer.log"
    with open(log, "wb") as out:
        code = subprocess.run([sys.executable, "-c", CRASHING_TRAINER], stdout=out, stderr=subprocess.STDOUT).returncode
    tail = output_tail(str(log))
    return protocol.ExitReport(reason=protocol.ExitReason.FAILED, exit_code=code, output_tail=tail,
                               last_exception=last_exception_line(tail)[:MAX_EXCEPTION_CHARS])


@pytest.fixture
def failed_twice(db, tmp_path):
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING)
    crash = crash_report(tmp_path)
    for _ in range(2):  # failing the same way twice fails the job
        agent = AgentClient()
        agent.register(make_instance(job).bootstrap_token)
        Job.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING)
        report = dataclasses.replace(crash, event_id=str(uuid.uuid4()))  # each VM's own report
        assert agent.post(protocol.PATH_EXIT, report).status_code == 200
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    return setup, job, crash


def test_the_crash_is_long_enough_to_have_been_cut(failed_twice):
    _, _, crash = failed_twice
    assert len(crash.output_tail) == protocol.MAX_OUTPUT_TAIL_CHARS and 480 < len(crash.last_exception) < 500


def test_the_page_shows_the_cause_and_the_whole_exception_line_at_the_top(failed_twice):
    setup, job, crash = failed_twice
    browser = Client()
    browser.force_login(setup.people["viewer"].user)
    page = browser.get(f"/jobs/{job.pk}/").content.decode()
    headline = f"The training code failed: exit 1: {crash.last_exception}"
    top = page.index('data-field="failure"')
    assert page.index(escape(headline), top) < page.index('class="figures"')
    status = browser.get(f"/jobs/{job.pk}/status.json").json()
    assert status["job"]["failure"] == headline


def test_events_keep_their_whole_message(failed_twice):
    setup, job, crash = failed_twice
    browser = Client()
    browser.force_login(setup.people["viewer"].user)
    messages = [e["message"] for e in browser.get(f"/jobs/{job.pk}/status.json").json()["events"]]
    assert f"user code failed (exit 1: {crash.last_exception})" in messages


def test_the_api_carries_the_cause_and_the_exception_line(failed_twice):
    setup, job, crash = failed_twice
    body = client_for(setup.people["viewer"]).get(f"/api/v1/jobs/{job.pk}/").json()
    assert body["failure_cause"] == "user_code"
    assert body["failure_headline"] == f"exit 1: {crash.last_exception}"
    assert body["failure_message"].startswith(body["failure_headline"] + "\n")
    assert body["failure_message"].endswith(crash.output_tail[-1000:])
