"""Reading a job's trainer output: every instance's lines in order, read on from
a cursor, with a signal that the job has ended and nothing is left."""

import pytest

from respawn_server.jobs.core import joblogs
from respawn_server.jobs.core.choices import InstanceState, JobStatus
from respawn_server.jobs.models import Job, LogChunk
from tests.api.clients import client_for
from tests.factories import make_instance, make_job, make_team_with_members


@pytest.fixture
def setup(db):
    return make_team_with_members()


def read(client, job, after=""):
    response = client.get(f"/api/v1/jobs/{job.pk}/logs/", {"after": after})
    assert response.status_code == 200, response.content
    return response.json()


def test_it_returns_each_instances_lines_in_order_and_reads_on_from_the_cursor(setup):
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING)
    first = make_instance(job, state=InstanceState.ENDED).instance
    second = make_instance(job, state=InstanceState.RUNNING).instance
    LogChunk.objects.create(instance=second, offset=0, lines=["resumed at 40"])
    LogChunk.objects.create(instance=first, offset=2, lines=["step 30", "step 40"])
    LogChunk.objects.create(instance=first, offset=0, lines=["step 10", "step 20"])
    client = client_for(setup.people["viewer"])
    page = read(client, job)
    assert [line["line"] for line in page["lines"]] == ["step 10", "step 20", "step 30", "step 40", "resumed at 40"]
    assert [line["instance"] for line in page["lines"]] == [first.pk] * 4 + [second.pk]
    assert page["finished"] is False and page["more"] is False
    assert read(client, job, page["next"])["lines"] == []
    LogChunk.objects.create(instance=second, offset=1, lines=["step 50", "[respawn-agent] 2026-12-06T00:00:00+00:00 x"])
    later = read(client, job, page["next"])
    assert [(line["offset"], line["line"][:15], line["agent"]) for line in later["lines"]] == [
        (1, "step 50", False), (2, "[respawn-agent]", True)]  # the agent's own line, marked


def test_it_says_finished_once_the_job_has_ended_and_every_line_is_read(setup):
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.SUCCEEDED)
    instance = make_instance(job, state=InstanceState.ENDED).instance
    LogChunk.objects.create(instance=instance, offset=0, lines=["done"])
    page = read(client_for(setup.people["member"]), job)
    assert page["finished"] is True and page["job_status"] == "succeeded" and len(page["lines"]) == 1


def test_a_long_backlog_comes_in_bounded_pages(setup, monkeypatch):
    monkeypatch.setattr(joblogs, "MAX_CHUNKS_PER_READ", 2)
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.SUCCEEDED)
    instance = make_instance(job, state=InstanceState.ENDED).instance
    for offset in range(5):
        LogChunk.objects.create(instance=instance, offset=offset, lines=[f"line {offset}"])
    client, after, seen = client_for(setup.people["member"]), "", []
    while True:
        page = read(client, job, after)
        seen += [line["line"] for line in page["lines"]]
        after = page["next"]
        if page["finished"]:
            break
        assert page["more"]
    assert seen == [f"line {i}" for i in range(5)]


def test_a_malformed_cursor_is_a_400_naming_after(setup):
    job = make_job(setup.team, setup.people["member"].user)
    response = client_for(setup.people["member"]).get(f"/api/v1/jobs/{job.pk}/logs/?after=yesterday")
    assert response.status_code == 400 and "after" in response.json()["errors"]
    assert Job.objects.filter(pk=job.pk).exists()
