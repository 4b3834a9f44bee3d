"""What a flaky network and a wrong clock do to agent reports: duplicated,
reordered and delayed reports are applied once, progress never goes back, and
an agent whose clock is hours off is judged on the control plane's clock."""

import random
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from respawn import protocol
from respawn_server.jobs import tasks
from respawn_server.jobs.core.choices import EndReason, InstanceState, JobStatus
from respawn_server.jobs.models import Checkpoint, Instance, InterruptionEvent, Job, LogChunk, MetricPoint, ProcessedEvent, ServiceBeat
from tests.agent_api.helpers import AgentClient, checkpoint_report
from tests.factories import make_instance, make_job, make_team_with_members


@pytest.fixture
def job(db):
    setup = make_team_with_members()
    return make_job(setup.team, setup.people["member"].user, status=JobStatus.PROVISIONING, total_steps=1000)


@pytest.fixture
def agent(job):
    setup = make_instance(job)
    client = AgentClient()
    assert client.register(setup.bootstrap_token).status_code == 200
    client.instance = setup.instance
    return client


def post_ok(agent, path, body):
    response = agent.post(path, body)
    assert response.status_code == 200, (path, response.status_code, response.content[:500])
    return response


def test_a_shuffled_stream_with_resends_is_applied_once_and_progress_never_goes_back(job, agent):
    rng = random.Random(9)
    heartbeats = [protocol.Heartbeat(step=step, loss=1.0 / step) for step in range(10, 210, 10)]
    checkpoints = [checkpoint_report(job, step) for step in range(50, 250, 50)]
    logs = [protocol.LogBatch(offset=i * 3, lines=[f"line {i}"] * 3) for i in range(6)]
    reports = [("heartbeat", r) for r in heartbeats] + [("checkpoints", r) for r in checkpoints] + \
              [("logs", r) for r in logs]
    # Every report sent one to three times, all in a random order: a retrying agent behind a lossy network.
    stream = [item for item in reports for _ in range(rng.randint(1, 3))]
    rng.shuffle(stream)
    seen_instance_step = seen_job_step = 0
    for path, body in stream:
        post_ok(agent, path, body)
        instance_step = Instance.objects.get(pk=agent.instance.pk).last_step
        job_step = Job.objects.get(pk=job.pk).last_step
        assert instance_step >= seen_instance_step and job_step >= seen_job_step, (path, body)
        seen_instance_step, seen_job_step = instance_step, job_step
    assert MetricPoint.objects.filter(instance=agent.instance).count() == len(heartbeats)
    assert Checkpoint.objects.filter(job=job).count() == len(checkpoints)
    assert LogChunk.objects.filter(instance=agent.instance).count() == len(logs)
    assert ProcessedEvent.objects.filter(instance_id=agent.instance.pk).count() == len(reports)
    job.refresh_from_db()
    assert job.last_step == 200 and job.newest_checkpoint.step == 200
    assert Instance.objects.get(pk=agent.instance.pk).last_step == 200


def test_a_replacement_resuming_earlier_moves_the_job_back_but_a_late_heartbeat_of_its_own_does_not(job, agent):
    post_ok(agent, "checkpoints", checkpoint_report(job, 100))
    post_ok(agent, "heartbeat", protocol.Heartbeat(step=140))
    post_ok(agent, "exit", protocol.ExitReport(reason="preempted", exit_code=0, final_step=140))
    Job.objects.filter(pk=job.pk).update(status=JobStatus.PROVISIONING)
    replacement = AgentClient()
    assert replacement.register(make_instance(job).bootstrap_token).json()["job"]["resume_step"] == 100
    post_ok(replacement, "heartbeat", protocol.Heartbeat(step=110))
    assert Job.objects.get(pk=job.pk).last_step == 110  # work since the checkpoint is redone: shown honestly
    # The old instance's last heartbeat, delayed past its own exit, changes nothing.
    post_ok(agent, "heartbeat", protocol.Heartbeat(step=145))
    post_ok(replacement, "heartbeat", protocol.Heartbeat(step=105))  # and a reordered one of the replacement
    assert Job.objects.get(pk=job.pk).last_step == 110


def test_reports_delayed_past_the_instance_end_are_kept_but_do_not_revive_it(job, agent):
    late_checkpoint = checkpoint_report(job, 300, kind=protocol.CheckpointKind.FINAL)
    late_logs = protocol.LogBatch(offset=0, lines=["the last words"])
    post_ok(agent, "exit", protocol.ExitReport(reason="preempted", exit_code=0, final_step=300))
    post_ok(agent, "checkpoints", late_checkpoint)
    post_ok(agent, "logs", late_logs)
    answer = post_ok(agent, "heartbeat", protocol.Heartbeat(step=301)).json()
    assert answer["action"] == protocol.Action.STOP
    instance = Instance.objects.get(pk=agent.instance.pk)
    assert instance.state == InstanceState.ENDED and instance.end_reason == EndReason.PREEMPTED
    assert Job.objects.get(pk=job.pk).newest_checkpoint.checkpoint_id == uuid.UUID(late_checkpoint.checkpoint_id)
    assert LogChunk.objects.get(instance=instance).lines == ["the last words"]


@pytest.mark.parametrize("skew", [timedelta(hours=5), -timedelta(hours=7)], ids=["agent-ahead", "agent-behind"])
def test_an_agent_clock_hours_off_is_judged_on_the_control_plane_clock(job, agent, skew, settings):
    agent_now = timezone.now() + skew
    before = timezone.now()
    heartbeat = protocol.Heartbeat(step=20, sent_at=agent_now.isoformat())
    assert post_ok(agent, "heartbeat", heartbeat).json()["action"] == protocol.Action.CONTINUE
    instance = Instance.objects.get(pk=agent.instance.pk)
    timeout = timedelta(seconds=settings.RESPAWN["HEARTBEAT_TIMEOUT_S"])
    assert before + timeout <= instance.heartbeat_deadline <= timezone.now() + timeout
    # The reconciler, with the API serving for an hour, sees a live instance, not a silent one.
    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": []}  # no VM of this machine is this test's to reap
    ServiceBeat.objects.create(name=tasks.AGENT_API_BEAT, last_seen=timezone.now(),
                               serving_since=timezone.now() - timedelta(hours=1))
    assert tasks.reconcile() == 0
    assert Instance.objects.get(pk=instance.pk).state == InstanceState.RUNNING
    # A notice and its checkpoint both on the agent's clock: saved in time, whatever the skew.
    notice = protocol.Notice(source="aws_imds", notice_time=agent_now.isoformat(),
                             deadline=(agent_now + timedelta(minutes=2)).isoformat(), sent_at=agent_now.isoformat())
    post_ok(agent, "notice", notice)
    post_ok(agent, "checkpoints", checkpoint_report(job, 20, kind=protocol.CheckpointKind.NOTICE,
                                                    committed_at=(agent_now + timedelta(seconds=10)).isoformat(),
                                                    sent_at=agent_now.isoformat()))
    assert InterruptionEvent.objects.get(instance=instance, kind="notice").checkpoint_saved is True
    assert Instance.objects.get(pk=instance.pk).last_step == 20
