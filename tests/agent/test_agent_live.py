"""A real agent, a real trainer subprocess and the real control plane: a
preemption notice from each cloud's metadata emulator (or a bare SIGTERM) ends
in a committed notice checkpoint recorded before the deadline."""

from __future__ import annotations

import contextlib
import sys

import psutil

import pytest

from respawn.metadata_server import MetadataServer
from respawn_server.jobs.core.choices import EndReason, InstanceState
from respawn_server.jobs.models import Checkpoint, Instance, InterruptionEvent
from tests.agent.live import AgentProcess, alive, children, make_running_job
from tests.conftest import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.store_incidental]


@pytest.mark.parametrize("provider,flavour", [("aws", "aws"), ("gcp", "gcp"), ("azure", "azure"), ("local", "aws")])
def test_a_notice_ends_in_a_committed_checkpoint_and_a_preempted_instance(provider, flavour, team_setup, child_env, web_server, tmp_path):
    imds = MetadataServer(flavour).start()
    job, setup = make_running_job(team_setup, tmp_path)
    agent = AgentProcess(child_env, tmp_path, url=web_server.url, bootstrap_token=setup.bootstrap_token, provider=provider, metadata_url=imds.url).start()
    try:
        instance = setup.instance
        wait_until(lambda: Instance.objects.get(pk=instance.pk).last_step > 20, timeout=60, what="training progress in heartbeats", proc=agent)
        trainer = agent.trainer_pid()
        imds.schedule_notice(deadline_in_s=30)
        wait_until(lambda: Instance.objects.get(pk=instance.pk).state == InstanceState.ENDED, timeout=60, what="instance ended", proc=None)
        agent.proc.wait(30)
    finally:
        agent.stop(9)
        imds.stop()
    instance.refresh_from_db()
    assert instance.end_reason == EndReason.PREEMPTED, agent.output()[-3000:]
    event = InterruptionEvent.objects.get(instance=instance)
    assert event.checkpoint_saved is True
    assert event.source == {"aws": "aws_imds", "gcp": "gcp_metadata", "azure": "azure_scheduled_events", "local": "local"}[provider]
    notice_ckpt = Checkpoint.objects.get(instance=instance, kind="notice")
    assert notice_ckpt.committed_at <= event.deadline
    assert agent.proc.returncode == 0
    assert trainer is not None and not alive(trainer)
    if provider == "azure":
        assert imds.snapshot()["acknowledged"] == [imds.snapshot()["event_id"]]


def test_sigterm_to_the_agent_is_a_notice(team_setup, child_env, web_server, tmp_path):
    imds = MetadataServer("aws").start()
    job, setup = make_running_job(team_setup, tmp_path)
    agent = AgentProcess(child_env, tmp_path, url=web_server.url, bootstrap_token=setup.bootstrap_token, provider="aws", metadata_url=imds.url).start()
    try:
        instance = setup.instance
        wait_until(lambda: Instance.objects.get(pk=instance.pk).last_step > 20, timeout=60, what="training progress in heartbeats", proc=agent)
        agent.terminate()
        agent.proc.wait(30)
    finally:
        agent.stop(9)
        imds.stop()
    instance.refresh_from_db()
    assert instance.state == InstanceState.ENDED and instance.end_reason == EndReason.PREEMPTED, agent.output()[-3000:]
    event = InterruptionEvent.objects.get(instance=instance)
    assert event.source == "sigterm" and event.checkpoint_saved is True


def test_library_checkpoints_are_validated_at_low_priority_and_reported(team_setup, child_env, web_server, tmp_path):
    imds = MetadataServer("aws").start()
    job, setup = make_running_job(
        team_setup, tmp_path, checkpoint_interval_s=4,
        validation_model_factory="respawn.examples.tiny:make_model", validation_batch_factory="respawn.examples.tiny:validation_batch",
    )
    job.command = [sys.executable, "-m", "respawn.examples.tiny", "--steps", "100000", "--step-delay", "0.01"]
    job.save(update_fields=["command"])
    agent = AgentProcess(child_env, tmp_path, url=web_server.url, bootstrap_token=setup.bootstrap_token, provider="aws", metadata_url=imds.url).start()
    instance = setup.instance
    validators: dict[int, tuple[float, list[str]]] = {}  # pid -> (start, argv) of every validator seen

    def two_validated() -> bool:
        for pid in children(agent.proc.pid):
            with contextlib.suppress(psutil.Error):
                process = psutil.Process(pid)
                if "respawn.checkpoint.validate" in process.cmdline():
                    validators.setdefault(pid, (process.create_time(), process.cmdline()))
        return Checkpoint.objects.filter(instance=instance, validation="valid").count() >= 2

    try:
        wait_until(two_validated, timeout=120, what="two validated checkpoints", proc=agent, interval=0.02)
        imds.schedule_notice(deadline_in_s=30)
        wait_until(lambda: Instance.objects.get(pk=instance.pk).state == InstanceState.ENDED, timeout=60, what="instance ended")
        agent.proc.wait(30)
    finally:
        agent.stop(9)
        imds.stop()
    assert not Checkpoint.objects.filter(instance=instance, validation="invalid").exists()
    assert InterruptionEvent.objects.get(instance=instance).checkpoint_saved is True, agent.output()[-3000:]
    # One warm validator checked them all: started before the first checkpoint committed,
    # not a fresh process (and torch's import) per checkpoint.
    [(started, argv)] = validators.values()
    assert "--serve" in argv and argv[argv.index("--serve") + 1:] == [
        "--preload=respawn.examples.tiny"], argv
    first = Checkpoint.objects.filter(instance=instance).order_by("step").first()
    assert started < first.committed_at.timestamp()
    assert "the validator is warm on cpu" in agent.output()
