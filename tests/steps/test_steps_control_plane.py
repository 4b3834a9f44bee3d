"""The control plane's side of a job's prepare and post steps: the spec a person
submits, what a post VM is told, the prepare step's events, and how the post
step's VM is placed, replaced and judged."""

from __future__ import annotations

from pathlib import Path

import pytest

from respawn import protocol
from respawn.cli.jobspec import InvalidSpec, load_job_spec
from respawn_server.jobs.core import services
from respawn_server.jobs.core.choices import EndReason, FailureCause, InstanceState, JobStatus, Market, Purpose
from respawn_server.jobs.core.transitions import end_instance
from respawn_server.jobs.fleet.instances import bootstrap_token_for
from respawn_server.jobs.fleet.post_steps import POST_MAX_LAUNCHES, start_post_steps
from respawn_server.jobs.fleet.reconciler import mark_lost
from respawn_server.jobs.models import Instance, Job
from respawn_server.jobs.reports.exits import record_exit
from tests.agent_api.helpers import AgentClient
from tests.api.clients import client_for
from tests.factories import make_instance, make_job, make_team_with_members

POST = ["python", "evaluate.py", "--split", "val"]


@pytest.fixture
def setup(db):
    return make_team_with_members()


def submit(setup, **fields):
    body = {"team": setup.team.pk, "name": "bert", "command": ["python", "train.py"], **fields}
    return client_for(setup.people["member"]).post("/api/v1/jobs/", body, format="json")


def trained_job(setup, *, post_command=POST, zone="local-b") -> Job:
    """A job whose training VM has just reported success with an exported artifact."""
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING, post_command=post_command,
                   prepare_command=["python", "prep.py"])
    trainer = make_instance(job, state=InstanceState.RUNNING, zone=zone).instance
    record_exit(trainer, reason=protocol.ExitReason.COMPLETED, exit_code=0, final_step=1000,
                output_tail="", last_exception="", artifact_uri="/ckpt/export/model.safetensors",
                artifact_digest="sha256:ab")
    job.refresh_from_db()
    return job


def post_instance(job: Job) -> Instance:
    (instance_id,) = start_post_steps()
    return Instance.objects.get(pk=instance_id)


def messages(job: Job) -> list[str]:
    return list(job.events.values_list("message", flat=True))


@pytest.mark.parametrize("fields,field", [
    ({"prepare_command": "python prep.py"}, "prepare_command"),
    ({"prepare_command": ["python", 3]}, "prepare_command"),
    ({"prepare_command": ["python", "prep.py"], "prepare_inputs": "prep.py"}, "prepare_inputs"),
    ({"prepare_command": ["python", "prep.py"], "prepare_inputs": [""]}, "prepare_inputs"),
    ({"prepare_inputs": ["prep.py"]}, "prepare_inputs"),
    ({"post_command": ["python", ""]}, "post_command"),
    ({"post_command": {"run": "eval"}}, "post_command"),
])
def test_bad_step_fields_are_refused_naming_the_field(setup, fields, field):
    response = submit(setup, **fields)
    assert response.status_code == 400 and list(response.json()["errors"]) == [field], response.json()
    assert not Job.objects.exists()


def test_a_job_with_steps_is_accepted_as_written(setup):
    response = submit(setup, prepare_command=["python", "prep.py"], prepare_inputs=["prep.py", "conf/"],
                      post_command=POST)
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["prepare_command"], body["prepare_inputs"], body["post_command"]) == (
        ["python", "prep.py"], ["prep.py", "conf/"], POST)


def test_the_job_file_refuses_prepare_inputs_without_a_prepare_command(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("team: vision\nname: x\ncommand: python t.py\nprepare_inputs: [prep.py]\n")
    with pytest.raises(InvalidSpec) as refused:
        load_job_spec(path)
    assert refused.value.problems == [f"{path}:4: field 'prepare_inputs': needs a prepare_command"]
    path.write_text("team: vision\nname: x\ncommand: python t.py\nprepare_command: python prep.py --v 2\n"
                    "prepare_inputs: [prep.py]\npost_command: python eval.py\n")
    body = load_job_spec(path).body
    assert (body["prepare_command"], body["post_command"]) == (["python", "prep.py", "--v", "2"], ["python", "eval.py"])


def test_the_prepare_step_s_outcome_on_each_vm_is_a_job_event(setup):
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.PROVISIONING,
                   prepare_command=["python", "prep.py"])
    instance = make_instance(job)
    agent = AgentClient()
    assert agent.register(instance.bootstrap_token).status_code == 200
    key = "a" * 64
    for report in (protocol.PrepareReport(outcome="ran", key=key, uri="/ckpt/job-1/prepare/" + key, seconds=2.5),
                   protocol.PrepareReport(outcome="reused", key=key, uri="/ckpt/job-1/prepare/" + key),
                   protocol.PrepareReport(outcome="failed", message="the prepare command exited with code 3")):
        assert agent.post(protocol.PATH_PREPARE, report).status_code == 200
    i, where = instance.instance.pk, f"/ckpt/job-1/prepare/{key}"
    assert messages(job)[-3:] == [
        f"prepare step ran on instance {i} in 2.5s (key aaaaaaaaaaaa); outputs stored at {where}",
        f"prepare step skipped on instance {i}: outputs for key aaaaaaaaaaaa already stored at {where}",
        f"prepare step failed on instance {i}: the prepare command exited with code 3",
    ]
    bad = agent.post(protocol.PATH_PREPARE, {"event_id": protocol.new_event_id(), "outcome": "skipped"})
    assert bad.status_code == 400 and list(bad.json()["errors"]) == ["outcome"], bad.json()


def test_training_success_moves_a_job_with_a_post_step_to_finishing_and_its_vm_goes_on_demand(setup):
    job = trained_job(setup)
    assert job.status == JobStatus.FINISHING and job.artifact_uri == "/ckpt/export/model.safetensors"
    post = post_instance(job)
    assert (post.purpose, post.market, post.zone, post.instance_type, post.world_size) == (
        Purpose.POST, Market.ON_DEMAND, "local-b", "cpu-small", 1)
    assert post.price_per_hour_at_launch is not None  # priced as the ledger prices it
    assert start_post_steps() == []  # one post VM at a time
    launching = f"post step: launching instance {post.pk} on local local-b cpu-small (on-demand, $1.00000/h)"
    assert launching in messages(job)


def test_a_job_without_a_post_step_succeeds_when_training_does(setup):
    assert trained_job(setup, post_command=[]).status == JobStatus.SUCCEEDED
    assert start_post_steps() == []


def test_the_post_vm_registers_and_is_told_the_post_command_and_the_artifact(setup):
    job = trained_job(setup)
    post = post_instance(job)
    response = AgentClient().register(bootstrap_token_for(post))
    assert response.status_code == 200, response.content  # an on-demand VM's interval is storable
    spec = protocol.from_dict(protocol.RegisterAnswer, response.json()).job
    assert (spec.command, spec.purpose, spec.artifact_uri, spec.artifact_digest) == (
        POST, Purpose.POST, "/ckpt/export/model.safetensors", "sha256:ab")
    assert spec.prepare_command == ["python", "prep.py"] and not spec.validation.enabled
    assert Instance.objects.get(pk=post.pk).checkpoint_interval["unnoticed_mtbi_s"] is None  # nothing interrupts it
    assert Job.objects.get(pk=job.pk).status == JobStatus.FINISHING


def post_exit(post: Instance, reason: str, code: int, exception: str = "") -> Job:
    record_exit(post, reason=reason, exit_code=code, final_step=None, output_tail="Traceback ...",
                last_exception=exception, artifact_uri="/elsewhere/model.onnx", artifact_digest="sha256:cd")
    return Job.objects.get(pk=post.job_id)


def test_the_post_step_s_success_is_the_job_s(setup):
    job = post_exit(post_instance(trained_job(setup)), protocol.ExitReason.COMPLETED, 0)
    assert job.status == JobStatus.SUCCEEDED and job.status_reason.startswith("training completed; post step succeeded")
    assert job.artifact_uri == "/ckpt/export/model.safetensors"  # the post step's own files are not the artifact
    assert job.last_step == 1000


def test_a_failing_post_step_fails_the_job_and_keeps_the_trained_artifact(setup):
    job = post_exit(post_instance(trained_job(setup)), protocol.ExitReason.FAILED, 1, "ValueError: empty split")
    assert (job.status, job.failure_cause) == (JobStatus.FAILED, FailureCause.USER_CODE)
    assert job.status_reason == "post step failed (exit 1: ValueError: empty split)"
    assert job.failure_message.startswith("post step: exit 1: ValueError: empty split\nTraceback")
    assert (job.artifact_uri, job.artifact_digest) == ("/ckpt/export/model.safetensors", "sha256:ab")
    assert start_post_steps() == []  # the code failed: not retried


def test_a_lost_post_vm_is_replaced_until_the_third(setup):
    job = trained_job(setup)
    for attempt in range(POST_MAX_LAUNCHES):
        post = post_instance(job)
        mark_lost(post)
        assert f"post step instance {post.pk} ended lost; launching another" in messages(job)
    assert start_post_steps() == []
    job.refresh_from_db()
    assert (job.status, job.failure_cause) == (JobStatus.FAILED, FailureCause.NO_CAPACITY)
    assert job.status_reason == "post step: 3 on-demand VMs ended without finishing it"


def test_a_zone_that_refused_a_post_vm_for_capacity_is_not_tried_again(setup):
    job = trained_job(setup, zone="local-a")
    first = post_instance(job)
    end_instance(first, EndReason.CAPACITY_ERROR, message="no capacity")
    assert start_post_steps() == []  # training ran in local-a only: nowhere left
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and job.status_reason.startswith("post step: no on-demand placement")


def test_a_late_report_of_a_training_vm_does_not_judge_the_post_step(setup):
    job = trained_job(setup)
    post_instance(job)
    trainer = job.instances.get(purpose=Purpose.TRAIN)
    record_exit(trainer, reason=protocol.ExitReason.FAILED, exit_code=1, final_step=None, output_tail="",
                last_exception="late", artifact_uri="", artifact_digest="")
    assert Job.objects.get(pk=job.pk).status == JobStatus.FINISHING


def test_cancelling_a_finishing_job_ends_with_its_post_vm(setup):
    job = trained_job(setup)
    post = post_instance(job)
    assert services.cancel_job(job, by=setup.people["member"].user)
    assert Job.objects.get(pk=job.pk).status == JobStatus.CANCELLING
    record_exit(post, reason=protocol.ExitReason.STOPPED, exit_code=-15, final_step=None, output_tail="",
                last_exception="", artifact_uri="", artifact_digest="")
    assert Job.objects.get(pk=job.pk).status == JobStatus.CANCELLED


def test_the_example_job_file_documents_both_steps():
    example = Path(__file__).resolve().parents[2] / "docs" / "job-spec.example.yaml"
    text = example.read_text()
    for documented in ("prepare_command:", "prepare_inputs:", "post_command:", "RESPAWN_PREPARE_DIR",
                       "RESPAWN_ARTIFACT_URI", "finishing"):
        assert documented in text
