"""What a VM may still do through the agent API (issue 16, items 1 and 2): a fenced
instance delivers what it did but steers nothing, and a checkpoint report is a claim
that is judged before the next VM resumes from it."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from respawn import protocol
from respawn_server.jobs.core import services
from respawn_server.jobs.core.choices import EndReason, InstanceState, JobStatus
from respawn_server.jobs.models import Checkpoint, Instance, InterruptionEvent, Job, JobEvent, LogChunk
from respawn_server.jobs.reports.notices import record_notice
from tests.agent_api.helpers import AgentClient, checkpoint_report, checkpoint_uri
from tests.factories import make_instance, make_job, make_team_with_members


@pytest.fixture
def job(db):
    setup = make_team_with_members()
    return make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING, total_steps=100_000)


def live_agent(job, **fields) -> AgentClient:
    setup = make_instance(job, state=InstanceState.RUNNING, registered=True, last_heartbeat_at=timezone.now(),
                          running_at=timezone.now() - timedelta(minutes=10), **fields)
    agent = AgentClient(setup.agent_token)
    agent.instance = setup.instance
    return agent


def fence(agent: AgentClient) -> None:
    """Replaced while still alive, a minute ago: within its grace window."""
    Instance.objects.filter(pk=agent.instance.pk).update(state=InstanceState.ENDED, end_reason=EndReason.FENCED,
                                                         ended_at=timezone.now() - timedelta(minutes=1))
    agent.instance.refresh_from_db()


def notice(**fields) -> dict:
    return {"event_id": str(uuid.uuid4()), "source": "aws_imds", "notice_time": timezone.now().isoformat(), **fields}


# --- item 1: a fenced instance ---------------------------------------------------------------

def test_a_fenced_instance_is_refused_what_would_steer_its_job_and_its_replacement_runs_on(job):
    old = live_agent(job)
    fence(old)
    new = live_agent(job, rank=0)

    refused = {"notice": old.post("notice", notice()),
               "prepare": old.post("prepare", {"event_id": str(uuid.uuid4()), "outcome": "failed", "message": "x"}),
               "rendezvous": old.client.get(protocol.API_PREFIX + "rendezvous")}
    assert {call: r.status_code for call, r in refused.items()} == dict.fromkeys(refused, 401)
    assert "only checkpoints, validation, logs, its last steps and its exit" in refused["notice"].json()["detail"]

    assert new.post("heartbeat", protocol.Heartbeat(step=10)).json()["action"] == protocol.Action.CONTINUE
    assert not InterruptionEvent.objects.exists()
    assert not JobEvent.objects.filter(job=job, message__contains="prepare").exists()
    # What it did is still delivered; its exit moves nothing of the job's.
    assert old.post("logs", protocol.LogBatch(offset=0, lines=["last words"])).status_code == 200
    assert old.post("exit", protocol.ExitReport(reason="failed", exit_code=1, final_step=99_000)).status_code == 200
    assert LogChunk.objects.filter(instance=old.instance).exists()
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.last_step == 10
    assert Instance.objects.get(pk=old.instance.pk).last_step == 0
    assert new.post("heartbeat", protocol.Heartbeat(step=11)).json()["action"] == protocol.Action.CONTINUE


def test_a_notice_from_an_instance_fenced_after_its_token_was_checked_asks_nothing_of_the_replacement(job):
    old = live_agent(job)
    stale = Instance.objects.get(pk=old.instance.pk)  # as the view loaded it: running
    fence(old)
    new = live_agent(job, rank=0)
    assert record_notice(stale, source="aws_imds", notice_time=timezone.now(), deadline=None, raw="") is None
    assert new.post("heartbeat", protocol.Heartbeat(step=1)).json()["action"] == protocol.Action.CONTINUE


def test_a_fenced_instance_judges_only_its_own_checkpoints(job):
    old = live_agent(job)
    fence(old)
    new = live_agent(job, rank=0)
    theirs = checkpoint_report(job, 50)
    assert new.post("checkpoints", theirs).status_code == 200
    mine = checkpoint_report(job, 5)
    assert old.post("checkpoints", mine).status_code == 200

    verdict = protocol.ValidationReport(result="invalid", message="says the fenced VM")
    assert old.post(f"checkpoints/{theirs.checkpoint_id}/validation", verdict).status_code == 404
    assert Checkpoint.objects.get(checkpoint_id=theirs.checkpoint_id).validation != "invalid"
    assert old.post(f"checkpoints/{mine.checkpoint_id}/validation", verdict).status_code == 200


def test_a_fenced_instances_notice_checkpoint_does_not_answer_the_live_instances_notice(job):
    old = live_agent(job)
    fence(old)
    new = live_agent(job, rank=0)
    assert new.post("notice", notice(deadline=(timezone.now() + timedelta(minutes=2)).isoformat())).status_code == 200
    assert old.post("checkpoints", checkpoint_report(job, 5, kind=protocol.CheckpointKind.NOTICE)).status_code == 200
    assert InterruptionEvent.objects.get(instance=new.instance).checkpoint_saved is None  # still waiting for its own



def test_a_gang_s_notice_save_reported_after_rank_0_was_lost_still_answers_rank_1_s_notice(db):
    # Rank 0 commits the gang's notice save; under load it can be ended lost (heartbeat
    # timeout) before its agent's report of that save arrives, which its token may still make.
    setup = make_team_with_members()
    gang = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING, nodes=2, total_steps=100_000)
    rank0, rank1 = live_agent(gang, rank=0), live_agent(gang, rank=1)
    assert rank1.post("notice", notice(deadline=(timezone.now() + timedelta(minutes=2)).isoformat())).status_code == 200
    Instance.objects.filter(pk=rank0.instance.pk).update(state=InstanceState.ENDED, end_reason=EndReason.LOST,
                                                         ended_at=timezone.now())
    rank0.instance.refresh_from_db()
    assert rank0.post("checkpoints", checkpoint_report(gang, 5, kind=protocol.CheckpointKind.NOTICE)).status_code == 200
    assert InterruptionEvent.objects.get(instance=rank1.instance).checkpoint_saved is True



def test_a_gang_s_notice_save_reported_before_the_notice_itself_answers_it(db):
    setup = make_team_with_members()
    gang = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING, nodes=2, total_steps=100_000)
    rank0, rank1 = live_agent(gang, rank=0), live_agent(gang, rank=1)
    seen = timezone.now()
    assert rank0.post("checkpoints", checkpoint_report(gang, 5, kind=protocol.CheckpointKind.NOTICE,
                                                       committed_at=(seen + timedelta(seconds=1)).isoformat())
                      ).status_code == 200
    assert rank1.post("notice", notice(notice_time=seen.isoformat(),
                                       deadline=(seen + timedelta(minutes=2)).isoformat())).status_code == 200
    assert InterruptionEvent.objects.get(instance=rank1.instance).checkpoint_saved is True
    # A notice after that save is still open: the save was not for it.
    assert rank1.post("notice", notice(notice_time=(seen + timedelta(seconds=5)).isoformat())).status_code == 200
    assert InterruptionEvent.objects.filter(instance=rank1.instance).order_by("-pk").first().checkpoint_saved is None


# --- item 2: checkpoint reports ---------------------------------------------------------------

BAD_URIS = {
    "a system file": lambda job: "/etc/passwd",
    "climbing out": lambda job: checkpoint_uri(job, 1) + "/../../../../etc",
    "climbing out, percent-encoded": lambda job: checkpoint_uri(job, 1) + "/%2e%2e/%2E%2E/x",
    "another job's prefix": lambda job: checkpoint_uri(job, 1).replace(f"job-{job.pk}", f"job-{job.pk + 1}"),
    "a prefix that merely starts the same": lambda job: checkpoint_uri(job, 1).replace(f"job-{job.pk}",
                                                                                       f"job-{job.pk}0"),
    "the prefix itself": lambda job: checkpoint_uri(job, 1).rsplit("/", 1)[0] + "/",
    "another scheme": lambda job: "s3://bucket" + checkpoint_uri(job, 1),
    "file:// for a plain path": lambda job: "file://" + checkpoint_uri(job, 1),
}


@pytest.mark.parametrize("case", BAD_URIS)
def test_a_checkpoint_outside_the_jobs_storage_prefix_is_refused_and_never_resumed_from(job, case):
    agent = live_agent(job)
    report = checkpoint_report(job, 10, uri=BAD_URIS[case](job))
    response = agent.post("checkpoints", report)
    assert response.status_code == 400 and "uri" in response.json()["errors"], response.content
    assert not Checkpoint.objects.exists()
    assert services.usable_checkpoint(job) is None


@pytest.mark.parametrize("root", ["s3://bucket/ckpt", "gs://bucket/ckpt/", "az://container/ckpt", "file:///srv/ckpt"])
def test_object_store_and_file_uris_under_the_prefix_are_taken(db, root):
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING, checkpoint_uri=root)
    agent = live_agent(job)
    assert agent.post("checkpoints", checkpoint_report(job, 10)).status_code == 200
    elsewhere = checkpoint_report(job, 10, uri=checkpoint_uri(job, 10).replace("bucket", "other-bucket")
                                  .replace("container", "other").replace("/srv/", "/etc/"))
    assert agent.post("checkpoints", elsewhere).status_code == 400


def test_a_step_beyond_the_total_or_far_ahead_of_the_heartbeats_is_refused(job):
    agent = live_agent(job)
    agent.post("heartbeat", protocol.Heartbeat(step=200))
    for step in (10**15, 100_001, 200 + 1001):
        response = agent.post("checkpoints", checkpoint_report(job, step))
        assert response.status_code == 400 and "step" in response.json()["errors"], (step, response.content)
    assert agent.post("checkpoints", checkpoint_report(job, 200 + 1000)).status_code == 200


def test_a_fast_trainer_may_checkpoint_as_far_ahead_as_its_own_pace_allows(job):
    agent = live_agent(job)
    # 6000 steps in the minute since it started: a checkpoint soon after may be thousands ahead.
    Instance.objects.filter(pk=agent.instance.pk).update(running_at=timezone.now() - timedelta(seconds=60),
                                                         last_heartbeat_at=timezone.now(), last_step=6000)
    assert agent.post("checkpoints", checkpoint_report(job, 7900)).status_code == 200
    assert agent.post("checkpoints", checkpoint_report(job, 60_000)).status_code == 400


def test_a_checkpoint_id_reused_with_another_digest_is_a_conflict_and_a_resend_a_duplicate(job):
    agent = live_agent(job)
    first = checkpoint_report(job, 10)
    assert agent.post("checkpoints", first).json() == {"ok": True, "duplicate": False}
    resent = protocol.to_dict(first) | {"event_id": str(uuid.uuid4())}  # an agent restarted on its journal
    assert agent.post("checkpoints", resent).json() == {"ok": True, "duplicate": True}
    for change in ({"manifest_digest": "xxh3-128:evil"}, {"step": 20}, {"uri": checkpoint_uri(job, 20)}):
        response = agent.post("checkpoints", protocol.to_dict(first) | {"event_id": str(uuid.uuid4()), **change})
        assert response.status_code == 409 and "checkpoint_id" in response.json()["errors"], (change, response.content)
    kept = Checkpoint.objects.get(checkpoint_id=first.checkpoint_id)
    assert (kept.step, kept.manifest_digest, kept.uri) == (10, first.manifest_digest, first.uri)


def test_a_checkpoint_id_of_another_job_is_a_conflict(job):
    other_job = make_job(job.team, job.owner, status=JobStatus.RUNNING)
    report = checkpoint_report(other_job, 10)
    assert live_agent(other_job).post("checkpoints", report).status_code == 200
    stolen = protocol.to_dict(report) | {"event_id": str(uuid.uuid4()), "uri": checkpoint_uri(job, 10)}
    assert live_agent(job).post("checkpoints", stolen).status_code == 409
    assert Checkpoint.objects.get(checkpoint_id=report.checkpoint_id).job_id == other_job.pk


def test_event_ids_are_one_instances_own(job):
    """An instance that learned (or guessed) another's next event ids cannot make its reports duplicates."""
    other_job = make_job(job.team, job.owner, status=JobStatus.RUNNING)
    squatter, victim = live_agent(other_job), live_agent(job)
    for path, body in (("logs", protocol.LogBatch(offset=0, lines=["x"], event_id=str(uuid.uuid4()))),
                       ("heartbeat", protocol.Heartbeat(step=7, event_id=str(uuid.uuid4())))):
        assert squatter.post(path, body).status_code == 200
        answer = victim.post(path, body)
        assert answer.status_code == 200 and not answer.json().get("duplicate"), (path, answer.content)
    assert LogChunk.objects.filter(instance=victim.instance).exists()
    assert Job.objects.get(pk=job.pk).last_step == Instance.objects.get(pk=victim.instance.pk).last_step == 7
