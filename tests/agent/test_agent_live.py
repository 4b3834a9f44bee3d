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


@contextlib.contextmanager
def agent_on_its_vm(team_setup, child_env, web_server, tmp_path, *, provider="aws", flavour="aws", **job_fields):
    """A running job's agent on a VM whose metadata service is `flavour`'s emulator:
    (job, instance, agent, imds); the agent is killed and the emulator stopped after."""
    imds = MetadataServer(flavour).start()
    job, setup = make_running_job(team_setup, tmp_path, **job_fields)
    agent = AgentProcess(child_env, tmp_path, url=web_server.url, bootstrap_token=setup.bootstrap_token, provider=provider,
                         metadata_url=imds.url).start()
    try:
        yield job, setup.instance, agent, imds
    finally:
        agent.stop(9)
        imds.stop()


def ended(instance) -> None:
    wait_until(lambda: Instance.objects.get(pk=instance.pk).state == InstanceState.ENDED, timeout=60, what="instance ended", proc=None)


@pytest.mark.parametrize("provider,flavour", [("aws", "aws"), ("gcp", "gcp"), ("azure", "azure"), ("local", "aws")])
def test_a_notice_ends_in_a_committed_checkpoint_and_a_preempted_instance(provider, flavour, team_setup, child_env, web_server, tmp_path):
    with agent_on_its_vm(team_setup, child_env, web_server, tmp_path, provider=provider, flavour=flavour) as (job, instance, agent, imds):
        wait_until(lambda: Instance.objects.get(pk=instance.pk).last_step > 20, timeout=60, what="training progress in heartbeats", proc=agent)
        trainer = agent.trainer_pid()
        imds.schedule_notice(deadline_in_s=30)
        ended(instance)
        agent.proc.wait(30)
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


def test_a_notice_while_the_trainer_still_starts_is_said_to_have_lost_nothing(team_setup, child_env, web_server, tmp_path):
    # A trainer importing its libraries (tens of seconds for some, on a loaded VM) has no
    # handler yet: the stop signal kills it. It trained nothing, and the record must say so,
    # not that a save was missed.
    still_importing = [sys.executable, "-c", "import time; time.sleep(120)"]
    with agent_on_its_vm(team_setup, child_env, web_server, tmp_path, command=still_importing) as (job, instance, agent, imds):
        wait_until(lambda: "trainer started" in agent.output(), timeout=60, what="the trainer's start", proc=agent)
        imds.schedule_notice(deadline_in_s=30)
        ended(instance)
        agent.proc.wait(30)
    instance.refresh_from_db()
    assert instance.end_reason == EndReason.PREEMPTED, agent.output()[-3000:]
    assert "the trainer had not reported a step since it started at step 0 when the notice came: nothing to save" in agent.output()
    event = InterruptionEvent.objects.get(instance=instance)
    assert event.checkpoint_saved is False and event.steps_lost == 0
    assert job.events.filter(message__contains="needed none").exists()
    assert not job.events.filter(message__startswith="notice missed").exists()


def test_sigterm_to_the_agent_is_a_notice(team_setup, child_env, web_server, tmp_path):
    with agent_on_its_vm(team_setup, child_env, web_server, tmp_path) as (job, instance, agent, imds):
        wait_until(lambda: Instance.objects.get(pk=instance.pk).last_step > 20, timeout=60, what="training progress in heartbeats", proc=agent)
        agent.terminate()
        agent.proc.wait(30)
    instance.refresh_from_db()
    assert instance.state == InstanceState.ENDED and instance.end_reason == EndReason.PREEMPTED, agent.output()[-3000:]
    event = InterruptionEvent.objects.get(instance=instance)
    assert event.source == "sigterm" and event.checkpoint_saved is True


def test_library_checkpoints_are_validated_at_low_priority_and_reported(team_setup, child_env, web_server, tmp_path):
    vm = agent_on_its_vm(team_setup, child_env, web_server, tmp_path, checkpoint_interval_s=4,
                         command=[sys.executable, "-m", "respawn.examples.tiny", "--steps", "100000", "--step-delay", "0.01"],
                         validation_model_factory="respawn.examples.tiny:make_model",
                         validation_batch_factory="respawn.examples.tiny:validation_batch")
    validators: dict[int, tuple[float, list[str]]] = {}  # pid -> (start, argv) of every validator seen

    def two_validated() -> bool:
        for pid in children(agent.proc.pid):
            with contextlib.suppress(psutil.Error):
                process = psutil.Process(pid)
                if "respawn.checkpoint.validate" in process.cmdline():
                    validators.setdefault(pid, (process.create_time(), process.cmdline()))
        return Checkpoint.objects.filter(instance=instance, validation="valid").count() >= 2

    with vm as (job, instance, agent, imds):
        wait_until(two_validated, timeout=120, what="two validated checkpoints", proc=agent, interval=0.02)
        imds.schedule_notice(deadline_in_s=30)
        ended(instance)
        agent.proc.wait(30)
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
