"""The control plane goes away mid-run, and the agent goes away for good."""

from __future__ import annotations

import json

import pytest

from respawn.journal import JOURNAL_NAME, _decode
from respawn.metadata_server import MetadataServer
from respawn_server.jobs.core.choices import EndReason, InstanceState
from respawn_server.jobs.models import Checkpoint, Instance, InterruptionEvent, LogChunk, MetricPoint, ProcessedEvent
from tests.agent.live import AgentProcess, alive, make_running_job
from tests.conftest import WebServer, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.store_incidental]


def journaled(work_dir):
    with open(work_dir / "journal" / JOURNAL_NAME, "rb") as f:
        return [_decode(line) for line in f]


def trainer_status(work_dir) -> dict:
    try:
        return json.loads((work_dir / "channel" / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def committed_lines(work_dir) -> int:
    try:
        return len((work_dir / "channel" / "checkpoints.jsonl").read_text().splitlines())
    except OSError:
        return 0


def test_after_an_outage_every_report_arrives_once_in_order(team_setup, child_env, web_server, tmp_path):
    imds = MetadataServer("aws").start()
    job, setup = make_running_job(team_setup, tmp_path, checkpoint_interval_s=0.5)
    agent = AgentProcess(child_env, tmp_path, url=web_server.url, bootstrap_token=setup.bootstrap_token, provider="aws", metadata_url=imds.url).start()
    instance = setup.instance
    revived = None
    try:
        wait_until(lambda: Instance.objects.get(pk=instance.pk).last_step > 10, timeout=60, what="heartbeats", proc=agent)
        web_server.stop()
        seen_step = trainer_status(agent.work_dir).get("step", 0)
        seen_ckpts = committed_lines(agent.work_dir)
        # Training goes on without the control plane: steps and checkpoints keep coming.
        wait_until(lambda: trainer_status(agent.work_dir).get("step", 0) > seen_step + 50 and committed_lines(agent.work_dir) > seen_ckpts, timeout=60, what="training during the outage", proc=agent)
        imds.schedule_notice(deadline_in_s=60)
        wait_until(lambda: agent.proc.poll() is not None or any(r["path"] == "exit" for r in journaled(agent.work_dir)), timeout=60, what="the trainer stopped during the outage")
        revived = WebServer(child_env, tmp_path / "web-revived.log", port=web_server.port).start()
        wait_until(lambda: Instance.objects.get(pk=instance.pk).state == InstanceState.ENDED, timeout=60, what="the journal replayed")
        agent.proc.wait(30)
    finally:
        agent.stop(9)
        imds.stop()
        if revived:
            revived.stop()
    records = journaled(agent.work_dir)
    assert all(r is not None for r in records)
    sent = [r["body"]["event_id"] for r in records]
    received = [str(e) for e in ProcessedEvent.objects.filter(instance_id=instance.pk).order_by("received_at").values_list("event_id", flat=True)]
    assert received == sent  # each once, in the order the agent made them
    kinds = [r["path"] for r in records]
    assert MetricPoint.objects.filter(instance=instance).count() == kinds.count("heartbeat")
    assert Checkpoint.objects.filter(instance=instance).count() == kinds.count("checkpoints") == committed_lines(agent.work_dir)
    offsets = list(LogChunk.objects.filter(instance=instance).order_by("offset").values_list("offset", "lines"))
    assert [o for o, _ in offsets] == [sum(len(lines) for _, lines in offsets[:i]) for i in range(len(offsets))]
    event = InterruptionEvent.objects.get(instance=instance)
    assert event.checkpoint_saved is True
    instance.refresh_from_db()
    assert instance.end_reason == EndReason.PREEMPTED


def test_an_agent_killed_with_sigkill_leaves_no_trainer_and_is_marked_lost(team_setup, child_env, web_server, tmp_path, settings):
    from respawn_server.jobs.tasks import reconcile

    # No instance id from the metadata service: the control plane has no VM to ask
    # the cloud about, so silence alone decides (a VM still running is "lost" too).
    imds = MetadataServer("aws", instance_id="").start()
    job, setup = make_running_job(team_setup, tmp_path)
    agent = AgentProcess(child_env, tmp_path, url=web_server.url, bootstrap_token=setup.bootstrap_token, provider="aws", metadata_url=imds.url).start()
    instance = setup.instance
    try:
        wait_until(lambda: Instance.objects.get(pk=instance.pk).last_step > 10, timeout=60, what="heartbeats", proc=agent)
        trainer = agent.trainer_pid()
        assert trainer is not None and alive(trainer)
        agent.stop(9)
        wait_until(lambda: not alive(trainer), timeout=10, what="the trainer to die with its agent")
        settings.RESPAWN = {**settings.RESPAWN, "HEARTBEAT_TIMEOUT_S": 1.0, "API_URL": web_server.url}
        settings.RECONCILE_INTERVAL_S = 0.2

        def reconciled_lost():
            reconcile()
            return Instance.objects.get(pk=instance.pk).state == InstanceState.ENDED

        wait_until(reconciled_lost, timeout=30, what="the reconciler to mark the instance lost", interval=0.2)
    finally:
        agent.stop(9)
        imds.stop()
    instance.refresh_from_db()
    assert instance.end_reason == EndReason.LOST
