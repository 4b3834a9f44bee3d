"""A checkpoint's validation as the people see it (issue 18 item 1, DESIGN §11): the job's
eval_fn reaches the VM, a check that failed is recorded `error` with its cause (not
`invalid`) and leaves the checkpoint resumable, and one nothing can check says why."""

import pytest
from django.test import Client

from respawn import protocol
from respawn_server.jobs.core.choices import JobStatus
from respawn_server.jobs.models import Checkpoint, Job, JobEvent
from tests.agent_api.helpers import AgentClient, checkpoint_report, checkpoint_uri
from tests.api.clients import client_for
from tests.factories import make_instance, make_job, make_team_with_members

FACTORIES = {"validation_model_factory": "train:model", "validation_batch_factory": "train:batch"}


@pytest.fixture
def setup(db):
    return make_team_with_members()


def register(job) -> tuple[AgentClient, dict]:
    answer = AgentClient().register(make_instance(job).bootstrap_token).json()
    return AgentClient(answer["agent_token"]), answer["job"]


def test_the_jobs_eval_fn_reaches_the_vm_and_a_failed_check_is_an_error_with_its_cause(setup):
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.PROVISIONING, **FACTORIES,
                   validation_eval_fn="train:perplexity")
    agent, spec = register(job)
    assert spec["validation"]["eval_fn"] == "train:perplexity"
    agent.post("checkpoints", checkpoint_report(job, 100))
    newer = checkpoint_report(job, 200)
    agent.post("checkpoints", newer)
    cause = "eval_fn 'train:perplexity' raised ValueError: labels out of range"
    answer = agent.post(f"checkpoints/{newer.checkpoint_id}/validation", protocol.ValidationReport(result="error", message=cause))
    assert answer.status_code == 200, answer.content
    shown = client_for(setup.people["member"]).get(f"/api/v1/checkpoints/?job={job.pk}").json()
    rows = {row["step"]: row for row in shown["results"]}
    assert (rows[200]["validation"], rows[200]["validation_message"]) == ("error", cause)
    assert JobEvent.objects.filter(job=job, message__contains="could not be validated").exists()
    # Not condemned: the next VM still resumes from it (and its trainer checks it again).
    agent.post("exit", protocol.ExitReport(reason="preempted", exit_code=0))
    Job.objects.filter(pk=job.pk).update(status=JobStatus.PROVISIONING)
    _, spec = register(job)
    assert spec["resume_from"] == checkpoint_uri(job, 200)


def test_a_checkpoint_nothing_can_check_says_why_it_was_not_validated(setup):
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.PROVISIONING)
    agent, _ = register(job)
    agent.post("checkpoints", checkpoint_report(job, 100))
    checkpoint = Checkpoint.objects.get(job=job)
    assert checkpoint.validation == "skipped"
    assert "names no validation model and batch factories" in checkpoint.validation_message


def test_a_malformed_eval_fn_is_refused_naming_the_field(setup):
    response = client_for(setup.people["member"]).post("/api/v1/jobs/", {
        "team": setup.team.pk, "name": "lm", "command": ["python", "train.py"], **FACTORIES,
        "validation_eval_fn": "perplexity"}, format="json")
    assert response.status_code == 400
    assert response.json()["errors"] == {"validation_eval_fn": ["validation_eval_fn must look like 'package.module:function'"]}


def test_a_checkpoint_no_validator_will_judge_is_recorded_skipped_saying_why_not_pending_forever(setup, settings):
    import uuid
    from datetime import timedelta

    from django.utils import timezone

    from respawn_server.jobs.core.choices import EndReason, InstanceState
    from respawn_server.jobs.core.transitions import end_instance
    from respawn_server.jobs.models import Instance
    from respawn_server.jobs.reports.checkpoints import expire_pending_validations

    job = make_job(setup.team, setup.people["member"].user, validation_model_factory="m:model",
                   validation_batch_factory="m:batch")
    ended = make_instance(job, state=InstanceState.RUNNING, registered=True).instance
    live = make_instance(job, state=InstanceState.RUNNING, registered=True, rank=1).instance

    def saved(instance):
        return Checkpoint.objects.create(checkpoint_id=uuid.uuid4(), job=job, instance=instance, step=100, uri="u",
                                         bytes=1, manifest_digest="d", committed_at=timezone.now())

    orphaned, still_judged = saved(ended), saved(live)
    end_instance(ended, EndReason.PREEMPTED, message="preempted")
    now = timezone.now()
    assert expire_pending_validations(now, batch=10) == 0  # within its grace window a late verdict may come
    later = now + timedelta(seconds=settings.RESPAWN["FENCE_GRACE_S"] + 1)
    assert Instance.objects.get(pk=ended.pk).ended_at < later
    assert expire_pending_validations(later, batch=10) == 1
    orphaned.refresh_from_db(), still_judged.refresh_from_db()
    assert orphaned.validation == "skipped" and "its VM ended before a verdict came" in orphaned.validation_message
    assert still_judged.validation == "pending"  # its VM lives: its validator may still report


def test_where_a_checkpoint_was_held_as_it_committed_is_recorded_and_shown(setup):
    """DESIGN §12: the manifest records which tiers hold a step; its report carries the
    record to the checkpoint's row, the API and the job page. A report that says nothing
    (an older trainer) is in storage alone."""
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.PROVISIONING)
    agent, _ = register(job)
    agent.post("checkpoints", checkpoint_report(job, 100))
    answer = agent.post("checkpoints", checkpoint_report(job, 120, kind="notice", tiers=["storage", "memory"]))
    assert answer.status_code == 200, answer.content
    member = client_for(setup.people["member"])
    rows = {row["step"]: row for row in member.get(f"/api/v1/checkpoints/?job={job.pk}").json()["results"]}
    assert (rows[100]["tiers"], rows[120]["tiers"]) == (["storage"], ["storage", "memory"])
    page = Client()
    page.force_login(setup.people["member"].user)
    shown = {row["step"]: row["tiers"] for row in page.get(f"/jobs/{job.pk}/status.json").json()["checkpoints"]}
    assert shown == {100: ["storage"], 120: ["storage", "memory"]}
