"""A notice checkpoint the next VM resumes from, and the final checkpoint a run
exports, are validated where they are used and the verdict reaches the control
plane: real agents, real trainers (respawn.examples.tiny), the real control plane.
Before, neither was ever validated by the agent (a notice save has the CPU, the
final one ends the VM) and both stayed `pending` forever."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from respawn import protocol
from respawn.metadata_server import MetadataServer
from respawn_server.jobs.core.choices import JobStatus
from respawn_server.jobs.models import Checkpoint, Instance, Job
from tests.agent.live import AgentProcess, make_running_job
from tests.agent_api.helpers import AgentClient, checkpoint_report
from tests.conftest import wait_until
from tests.factories import make_instance, make_job

pytestmark = pytest.mark.store_incidental

TINY = [sys.executable, "-m", "respawn.examples.tiny", "--step-delay", "0.01"]


def run_agent(child_env, tmp_path, web_server, bootstrap_token: str, name: str, until, what: str, *, notice: bool):
    imds = MetadataServer("aws").start()
    agent = AgentProcess(child_env, tmp_path, url=web_server.url, bootstrap_token=bootstrap_token, provider="aws",
                         metadata_url=imds.url, name=name).start()
    try:
        if notice:
            wait_until(until, timeout=90, what=what, proc=agent)
            imds.schedule_notice(deadline_in_s=30)
        agent.proc.wait(120)
    finally:
        agent.stop(9)
        imds.stop()
    return agent


@pytest.mark.e2e
def test_the_resumed_notice_checkpoint_and_the_exported_final_one_are_validated(team_setup, child_env, web_server,
                                                                                tmp_path):
    job, first = make_running_job(
        team_setup, tmp_path, validation_model_factory="respawn.examples.tiny:make_model",
        validation_batch_factory="respawn.examples.tiny:validation_batch")
    Job.objects.filter(pk=job.pk).update(command=[*TINY, "--steps", "100000"])
    progressed = lambda: Instance.objects.get(pk=first.instance.pk).last_step > 30  # noqa: E731
    agent = run_agent(child_env, tmp_path, web_server, first.bootstrap_token, "first", progressed, "training progress",
                      notice=True)
    notice = Checkpoint.objects.get(instance=first.instance, kind=protocol.CheckpointKind.NOTICE)
    assert notice.validation == "pending", agent.output()[-3000:]  # nothing validated it on the VM it was saved on

    # The next VM resumes from it and trains to the end.
    Job.objects.filter(pk=job.pk).update(status=JobStatus.PROVISIONING, command=[*TINY, "--steps", str(notice.step + 40)])
    second = make_instance(job)
    agent = run_agent(child_env, tmp_path, web_server, second.bootstrap_token, "second", None, "", notice=False)
    assert Instance.objects.get(pk=second.instance.pk).resume_checkpoint_id == notice.pk
    notice.refresh_from_db()
    final = Checkpoint.objects.get(instance=second.instance, kind=protocol.CheckpointKind.FINAL)
    assert (notice.validation, final.validation) == ("valid", "valid"), agent.output()[-3000:]
    assert notice.validation_loss is not None and final.validation_loss is not None
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED and job.newest_valid_checkpoint_id == final.pk and job.artifact_uri


@pytest.mark.e2e
def test_the_agent_validates_the_checkpoint_it_resumes_from_while_its_trainer_starts(team_setup, child_env, web_server,
                                                                                    tmp_path):
    """The next VM's warm validator judges the notice checkpoint as soon as the VM knows it
    resumes from it: here the trainer never reads it (it only sleeps), so the verdict that
    reaches the control plane is the agent's, recorded beside the checkpoint too."""
    job, first = make_running_job(
        team_setup, tmp_path, validation_model_factory="respawn.examples.tiny:make_model",
        validation_batch_factory="respawn.examples.tiny:validation_batch")
    Job.objects.filter(pk=job.pk).update(command=[*TINY, "--steps", "100000"])
    progressed = lambda: Instance.objects.get(pk=first.instance.pk).last_step > 30  # noqa: E731
    run_agent(child_env, tmp_path, web_server, first.bootstrap_token, "first", progressed, "training progress", notice=True)
    notice = Checkpoint.objects.get(instance=first.instance, kind=protocol.CheckpointKind.NOTICE)
    assert notice.validation == "pending"

    Job.objects.filter(pk=job.pk).update(status=JobStatus.PROVISIONING,
                                         command=[sys.executable, "-c", "import time; time.sleep(600)"])
    second = make_instance(job)
    imds = MetadataServer("aws").start()
    agent = AgentProcess(child_env, tmp_path, url=web_server.url, bootstrap_token=second.bootstrap_token,
                         provider="aws", metadata_url=imds.url, name="second").start()
    try:
        wait_until(lambda: Checkpoint.objects.get(pk=notice.pk).validation != "pending", timeout=120,
                   what="a verdict on the resume checkpoint", proc=agent)
    finally:
        agent.stop(9)
        imds.stop()
    notice.refresh_from_db()
    assert Instance.objects.get(pk=second.instance.pk).resume_checkpoint_id == notice.pk
    assert notice.validation == "valid" and notice.validation_loss is not None, notice.validation_message
    assert json.loads(Path(notice.uri, "VALIDATION.json").read_text())["result"] == "valid"
    assert not [p for p in Path(notice.uri).parent.rglob("*") if ".tmp" in p.name]


def test_a_job_with_nothing_to_validate_with_records_its_checkpoints_as_skipped_and_why(team_setup):
    job = make_job(team_setup.team, team_setup.people["member"].user, status=JobStatus.PROVISIONING)
    agent = AgentClient()
    agent.register(make_instance(job).bootstrap_token)
    report = checkpoint_report(job, 100, kind=protocol.CheckpointKind.FINAL)
    assert agent.post(protocol.PATH_CHECKPOINTS, report).status_code == 200
    checkpoint = Checkpoint.objects.get(checkpoint_id=report.checkpoint_id)
    assert checkpoint.validation == "skipped"
    assert checkpoint.validation_message == ("not validated: the job names no validation model and batch factories "
                                             "to check it with")
