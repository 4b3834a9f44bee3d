"""The agent acts on heartbeat answers from the real control plane and reports
how its trainer ended."""

from __future__ import annotations

import sys

import pytest
from django.test import Client

from respawn.protocol import Action
from respawn_server.jobs.core import services
from respawn_server.jobs.core.choices import EndReason, InstanceState, JobStatus
from respawn_server.jobs.models import Checkpoint, Instance, Job, LogChunk
from tests.agent.live import AgentProcess, alive, make_running_job
from tests.conftest import wait_until
from tests.factories import make_instance, make_job

pytestmark = [pytest.mark.e2e, pytest.mark.store_incidental]


def start_agent(child_env, tmp_path, web_server, imds, setup):
    return AgentProcess(child_env, tmp_path, url=web_server.url, bootstrap_token=setup.bootstrap_token, provider="aws", metadata_url=imds.url).start()


def run_to_its_end(child_env, tmp_path, web_server, imds, setup):
    """Start the agent of `setup`'s instance and wait until the instance has ended and the
    agent has exited: the ended instance, and the agent (its output)."""
    agent = start_agent(child_env, tmp_path, web_server, imds, setup)
    try:
        instance = ended(setup.instance)
        agent.proc.wait(30)
    finally:
        agent.stop(9)
    return instance, agent


def training(instance, agent):
    wait_until(lambda: Instance.objects.get(pk=instance.pk).last_step > 5, timeout=60, what="training progress", proc=agent)


def ended(instance):
    wait_until(lambda: Instance.objects.get(pk=instance.pk).state == InstanceState.ENDED, timeout=60, what="instance ended")
    instance.refresh_from_db()
    return instance


def test_checkpoint_request_and_new_interval_reach_the_trainer(team_setup, child_env, web_server, tmp_path, imds):
    job, setup = make_running_job(team_setup, tmp_path, checkpoint_interval_s=3600)
    agent = start_agent(child_env, tmp_path, web_server, imds, setup)
    try:
        training(setup.instance, agent)
        services.request_action(job.pk, Action.CHECKPOINT)
        wait_until(lambda: Checkpoint.objects.filter(instance=setup.instance).count() == 1, timeout=30, what="a requested checkpoint", proc=agent)
        # The job's interval override changes; the control plane re-derives the instance's on its next refresh.
        Job.objects.filter(pk=job.pk).update(checkpoint_interval_s=0.2)
        Instance.objects.filter(pk=setup.instance.pk).update(checkpoint_interval={"seconds": 0.2})
        wait_until(lambda: Checkpoint.objects.filter(instance=setup.instance).count() >= 4, timeout=30, what="checkpoints at the new interval", proc=agent)
    finally:
        agent.stop(9)


def test_a_checkpoint_asked_before_the_trainer_has_started_waits_for_it_instead_of_killing_it(
        team_setup, child_env, web_server, tmp_path, imds):
    # SIGUSR1 kills a trainer that has not yet installed the library's handler (importing
    # torch): an elastic gang's joiner asks for a checkpoint seconds after a regroup restarts it.
    job, setup = make_running_job(team_setup, tmp_path, checkpoint_interval_s=3600)
    services.request_action(job.pk, Action.CHECKPOINT)  # there at the trainer's first heartbeat
    agent = start_agent(child_env, tmp_path, web_server, imds, setup)
    try:
        wait_until(lambda: Checkpoint.objects.filter(instance=setup.instance).exists(), timeout=60,
                   what="the requested checkpoint", proc=agent)
        assert Instance.objects.get(pk=setup.instance.pk).state == InstanceState.RUNNING
    finally:
        agent.stop(9)
    assert "exit code -10" not in agent.output()  # SIGUSR1 had killed it


def test_cancel_stops_the_trainer_and_the_instance_ends_cancelled(team_setup, child_env, web_server, tmp_path, imds):
    job, setup = make_running_job(team_setup, tmp_path)
    agent = start_agent(child_env, tmp_path, web_server, imds, setup)
    try:
        training(setup.instance, agent)
        trainer = agent.trainer_pid()
        services.cancel_job(job, by=team_setup.people["admin"].user)
        instance = ended(setup.instance)
        agent.proc.wait(30)
    finally:
        agent.stop(9)
    assert instance.end_reason == EndReason.CANCELLED
    assert not alive(trainer)


def test_a_failing_trainer_is_reported_with_its_exception(team_setup, child_env, web_server, tmp_path, imds):
    job, setup = make_running_job(team_setup, tmp_path)
    Job.objects.filter(pk=job.pk).update(command=[sys.executable, "-c", "print('loading data'); raise ValueError('bad shape (3, 4)')"])
    instance, _ = run_to_its_end(child_env, tmp_path, web_server, imds, setup)
    assert instance.end_reason == EndReason.FAILED
    job.refresh_from_db()
    assert "ValueError: bad shape (3, 4)" in job.last_failure_signature
    lines = [line for chunk in instance.log_chunks.order_by("offset") for line in chunk.lines]
    assert "loading data" in lines


def test_a_trainer_that_aborts_after_stopping_on_a_stop_request_ends_stopped_not_failed(team_setup, child_env,
                                                                                      web_server, tmp_path, imds):
    # A gang's rank whose stop came from its peers (the coordinator), not from its agent: it
    # saved and said so, then gloo's teardown aborted the process (seen in CI: exit -6).
    job, setup = make_running_job(team_setup, tmp_path)
    Job.objects.filter(pk=job.pk).update(command=[sys.executable, "-c", "import os; from respawn import trainer; "
                                                  "trainer.report(7, force=True, stopped=True); os.abort()"])
    instance, _ = run_to_its_end(child_env, tmp_path, web_server, imds, setup)
    job.refresh_from_db()
    assert (instance.end_reason, instance.last_step) == (EndReason.FENCED, 7)
    assert (job.failure_restarts, job.last_failure_signature) == (0, "")


def test_a_command_that_cannot_start_is_a_setup_failure(team_setup, child_env, web_server, tmp_path, imds):
    job, setup = make_running_job(team_setup, tmp_path)
    Job.objects.filter(pk=job.pk).update(command=["/nonexistent/python", "train.py"])
    instance, _ = run_to_its_end(child_env, tmp_path, web_server, imds, setup)
    assert instance.end_reason == EndReason.FAILED
    job.refresh_from_db()
    assert job.failure_cause == "setup"
    assert "No such file or directory: '/nonexistent/python'" in job.failure_message


def test_a_rebalance_recommendation_is_reported_and_only_acted_on_when_asked(team_setup, child_env, web_server, tmp_path, imds):
    job, setup = make_running_job(team_setup, tmp_path, checkpoint_interval_s=3600)
    agent = AgentProcess(child_env, tmp_path, url=web_server.url, bootstrap_token=setup.bootstrap_token, provider="aws", metadata_url=imds.url)
    agent.argv.append("--checkpoint-on-rebalance")
    agent.start()
    try:
        training(setup.instance, agent)
        imds.schedule_notice(kind="rebalance")
        wait_until(lambda: Checkpoint.objects.filter(instance=setup.instance).exists(), timeout=30, what="a checkpoint on rebalance", proc=agent)
        wait_until(lambda: any("rebalance recommendation" in line for c in setup.instance.log_chunks.all() for line in c.lines), timeout=30, what="the recommendation in the job's output", proc=agent)
        assert Instance.objects.get(pk=setup.instance.pk).state == InstanceState.RUNNING  # not a notice: training goes on
    finally:
        agent.stop(9)


def test_with_spare_on_rebalance_the_agent_reports_it_trains_on_and_hands_over_when_its_spare_is_ready(
        team_setup, child_env, web_server, tmp_path, imds, settings):
    from respawn_server.jobs.recovery.spares import end_notice_hold, launch_spare
    from respawn_server.jobs.reports.registration import register_instance

    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": ["local"]}
    job, setup = make_running_job(team_setup, tmp_path, checkpoint_interval_s=3600, spare_on_rebalance=True,
                                  allowed_clouds=["local"])
    agent = start_agent(child_env, tmp_path, web_server, imds, setup)
    try:
        training(setup.instance, agent)
        imds.schedule_notice(kind="rebalance")
        wait_until(lambda: job.events.filter(message__contains="launching a spare to move the job to").exists(),
                   timeout=30, what="the recommendation reported to the control plane", proc=agent)
        step = Instance.objects.get(pk=setup.instance.pk).last_step
        wait_until(lambda: Instance.objects.get(pk=setup.instance.pk).last_step > step + 20, timeout=30,
                   what="training on after the recommendation", proc=agent)
        assert Instance.objects.get(pk=setup.instance.pk).state == InstanceState.RUNNING
        # The spare (launched by the worker's task, run here) registers and, prepared, asks standby.
        spare = Instance.objects.get(pk__in=launch_spare(setup.instance.pk))
        register_instance(spare, hostname="spare", agent_version="t", provider_instance_id="")
        told_at = Instance.objects.get(pk=setup.instance.pk).last_step
        end_notice_hold(setup.instance.pk, spare_ready=True)
        ended(setup.instance)
    finally:
        agent.stop(9)
    old, spare = Instance.objects.get(pk=setup.instance.pk), Instance.objects.get(pk=spare.pk)
    # Its trainer's save on the stop (this script's own kind of it), the newest: the spare's start.
    handover = [c for c in Checkpoint.objects.filter(job=job) if c.instance_id == old.pk][-1]
    assert handover.step >= told_at
    assert old.end_reason == EndReason.FENCED and Job.objects.get(pk=job.pk).preemptions == 0
    assert (spare.standby_for_id, spare.resume_checkpoint_id) == (None, handover.pk)


def test_a_finished_library_job_reports_its_exported_artifact(team_setup, child_env, web_server, tmp_path, imds):
    job, setup = make_running_job(
        team_setup, tmp_path, validation_model_factory="respawn.examples.tiny:make_model", validation_batch_factory="respawn.examples.tiny:validation_batch",
    )
    Job.objects.filter(pk=job.pk).update(command=[sys.executable, "-m", "respawn.examples.tiny", "--steps", "60"])
    instance, agent = run_to_its_end(child_env, tmp_path, web_server, imds, setup)
    assert instance.end_reason == EndReason.COMPLETED, agent.output()[-3000:]
    job.refresh_from_db()
    assert job.artifact_uri.endswith("model.safetensors") and job.artifact_digest


# A state too big for the notice window is known before any notice (issue 19, item 5):
# the agent sends each periodic save's persist time (the library's, less its pacing) with
# the window its VM gets, says so in the job's output, and the job page warns. The
# window is set tiny (as for a local simulator's lead) so that a real save exceeds it.
SAVE_WINDOW_S = 0.001  # leaves half a millisecond to save: no real save fits


def test_a_save_slower_than_the_window_is_reported_said_and_shown(team_setup, child_env, web_server, tmp_path, imds):
    owner = team_setup.people["admin"].user
    job = make_job(team_setup.team, owner, total_steps=100_000, status=JobStatus.PROVISIONING, checkpoint_uri=str(tmp_path / "ckpt"),
                   command=[sys.executable, "-m", "respawn.examples.tiny", "--steps", "100000", "--every-steps", "10", "--step-delay", "0.01"])
    setup = make_instance(job, provider="aws", region="us-east-1", zone="us-east-1a")
    env = child_env | {"RESPAWN_NOTICE_WINDOW_S": str(SAVE_WINDOW_S)}
    agent = AgentProcess(env, tmp_path, url=web_server.url, bootstrap_token=setup.bootstrap_token, provider="aws", metadata_url=imds.url).start()
    periodic = Checkpoint.objects.filter(instance=setup.instance, kind="periodic")
    try:
        wait_until(lambda: periodic.exists(), timeout=60, what="a periodic checkpoint", proc=agent)
        wait_until(lambda: any("would not commit in time" in line for chunk in LogChunk.objects.filter(instance=setup.instance)
                                   for line in chunk.lines), timeout=30, what="the agent's warning in the job's output", proc=agent)
    finally:
        agent.stop(9)
    checkpoint = periodic.order_by("step").first()
    assert checkpoint.notice_window_s == SAVE_WINDOW_S
    assert 0 < checkpoint.persist_s <= checkpoint.save_s
    viewer = Client()
    viewer.force_login(owner)
    html = viewer.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="save-warning"' in html and "; AWS gives 0 s notice (0 s to save)" in html


def test_a_run_whose_launcher_fails_after_the_final_commit_is_complete_not_failed(team_setup, child_env, web_server,
                                                                                  tmp_path, imds):
    # torchrun exits 1 when a rank aborts in its teardown after the gang's final commit: the
    # job is judged by what was committed, not by the launcher's exit code.
    job, setup = make_running_job(team_setup, tmp_path)
    Job.objects.filter(pk=job.pk).update(command=[sys.executable, "-c", "import os; from respawn.examples import tiny; "
                                                  "tiny.main(['--steps', '20']); os._exit(1)"])
    instance, agent = run_to_its_end(child_env, tmp_path, web_server, imds, setup)
    job.refresh_from_db()
    assert instance.end_reason == EndReason.COMPLETED, agent.output()[-3000:]
    assert job.status == JobStatus.SUCCEEDED and job.last_failure_signature == ""
    assert "exited 1 after its final checkpoint (step 20) committed" in agent.output()
