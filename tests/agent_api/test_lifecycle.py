"""An agent's whole life through the API: register, heartbeat, notice,
checkpoint, validation, logs, exit — and what the job and instance become."""

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import requests
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from respawn import protocol
from respawn_server.jobs.core.choices import EndReason, FailureCause, InstanceState, JobStatus
from respawn_server.jobs.models import Checkpoint, Instance, InterruptionEvent, Job, LogChunk, MetricPoint, ProcessedEvent
from tests.agent_api.helpers import AgentClient, checkpoint_report, checkpoint_uri
from tests.factories import make_instance, make_job, make_team_with_members


@pytest.fixture
def job(db):
    setup = make_team_with_members()
    return make_job(setup.team, setup.people["member"].user, status=JobStatus.PROVISIONING)


@pytest.fixture
def agent(job):
    setup = make_instance(job)
    client = AgentClient()
    response = client.register(setup.bootstrap_token)
    assert response.status_code == 200, response.content
    client.instance = setup.instance
    client.bootstrap_token = setup.bootstrap_token
    return client


def test_register_gives_agent_token_and_job_spec(job):
    setup = make_instance(job)
    client = AgentClient()
    response = client.register(setup.bootstrap_token)
    assert response.status_code == 200
    answer = protocol.from_dict(protocol.RegisterAnswer, response.json())
    assert answer.agent_token.startswith("rsa_")
    assert answer.job.command == ["python", "train.py"] and answer.job.resume_from is None
    instance = Instance.objects.get(pk=setup.instance.pk)
    assert instance.state == InstanceState.RUNNING and instance.heartbeat_deadline is not None
    assert instance.agent_token_hash != answer.agent_token  # stored hashed
    assert Job.objects.get(pk=job.pk).status == JobStatus.RUNNING


def test_bootstrap_token_is_single_use(agent):
    again = AgentClient().register(agent.bootstrap_token)
    assert again.status_code == 401
    assert "already used" in again.json()["detail"]


def test_register_resent_after_network_fault_gets_a_fresh_token(job):
    setup = make_instance(job)
    first = AgentClient().register(setup.bootstrap_token, event_id="11111111-1111-4111-8111-111111111111")
    resent = AgentClient().register(setup.bootstrap_token, event_id="11111111-1111-4111-8111-111111111111")
    assert first.status_code == resent.status_code == 200
    assert AgentClient(resent.json()["agent_token"]).post("heartbeat", protocol.Heartbeat(step=1)).status_code == 200
    assert AgentClient(first.json()["agent_token"]).post("heartbeat", protocol.Heartbeat(step=1)).status_code == 401


def test_register_fixes_the_resume_checkpoint(job, agent):
    agent.post("checkpoints", checkpoint_report(job, 100))
    bad = checkpoint_report(job, 200)
    agent.post("checkpoints", bad)
    agent.post(f"checkpoints/{bad.checkpoint_id}/validation", protocol.ValidationReport(result="invalid"))
    agent.post("exit", protocol.ExitReport(reason="preempted", exit_code=0))
    Job.objects.filter(pk=job.pk).update(status=JobStatus.PROVISIONING)
    replacement = AgentClient().register(make_instance(job).bootstrap_token)
    spec = replacement.json()["job"]
    assert spec["resume_step"] == 100 and spec["resume_from"] == checkpoint_uri(job, 100)


def test_heartbeat_moves_progress_and_deadline(agent):
    before = Instance.objects.get(pk=agent.instance.pk).heartbeat_deadline
    response = agent.post("heartbeat", protocol.Heartbeat(step=42, loss=0.5, samples_per_s=100.0))
    assert response.json()["action"] == "continue"
    instance = Instance.objects.get(pk=agent.instance.pk)
    assert instance.last_step == 42 and instance.heartbeat_deadline > before
    assert MetricPoint.objects.get(instance=instance).loss == 0.5


def test_a_heartbeat_in_another_charset_gets_the_same_answer_and_effect(agent):
    """Heartbeats in UTF-8 JSON skip DRF's request objects; any other body is read by DRF, to the same end."""
    utf8 = agent.post("heartbeat", protocol.Heartbeat(step=7, loss=0.5))
    body = json.dumps(protocol.to_dict(protocol.Heartbeat(step=8, loss=0.25))).encode("latin-1")
    latin1 = agent.client.post(protocol.API_PREFIX + "heartbeat", body, content_type="application/json; charset=latin-1")
    assert utf8.status_code == latin1.status_code == 200
    assert utf8.json() == latin1.json() == {"action": "continue", "checkpoint_interval_s": utf8.json()["checkpoint_interval_s"],
                                            "heartbeat_interval_s": utf8.json()["heartbeat_interval_s"],
                                            "gang_generation": 0, "handover": None}
    assert sorted(MetricPoint.objects.filter(instance=agent.instance).values_list("step", "loss")) == [(7, 0.5), (8, 0.25)]
    assert Instance.objects.get(pk=agent.instance.pk).last_step == 8


def test_an_older_heartbeat_never_moves_an_instance_back(agent):
    agent.post("heartbeat", protocol.Heartbeat(step=50))
    agent.post("heartbeat", protocol.Heartbeat(step=40))
    assert Instance.objects.get(pk=agent.instance.pk).last_step == 50


def test_heartbeat_costs_a_fixed_number_of_queries(job, agent):
    def count():
        with CaptureQueriesContext(connection) as queries:
            assert agent.post("heartbeat", protocol.Heartbeat(step=1)).status_code == 200
        return len(queries)

    baseline = count()
    for step in range(5):  # history grows: checkpoints, metrics, logs
        agent.post("checkpoints", checkpoint_report(job, step))
        agent.post("logs", protocol.LogBatch(offset=step * 10, lines=["x"] * 10))
    assert count() == baseline
    # PostgreSQL: one statement looks the token up and writes everything (respawn_server.jobs.fleet.heartbeats.record_heartbeat).
    # Elsewhere the lookup, then the ORM's savepoint around the event row and one query per write.
    assert baseline <= (1 if connection.vendor == "postgresql" else 9)


def test_a_resent_report_is_applied_once(job, agent):
    report = checkpoint_report(job, 10)
    assert agent.post("checkpoints", report).json() == {"ok": True, "duplicate": False}
    assert agent.post("checkpoints", report).json() == {"ok": True, "duplicate": True}
    logs = protocol.LogBatch(offset=0, lines=["a", "b"])
    agent.post("logs", logs)
    agent.post("logs", logs)
    assert Checkpoint.objects.count() == 1 and LogChunk.objects.count() == 1
    beat = protocol.Heartbeat(step=5)
    agent.post("heartbeat", beat)
    agent.post("heartbeat", beat)
    assert MetricPoint.objects.count() == 1


def test_racing_resends_of_one_heartbeat_are_applied_once(team_setup, web_server):
    """A retrying agent behind a lossy proxy: one heartbeat arrives many times at once."""
    job = make_job(team_setup.team, team_setup.people["admin"].user, status=JobStatus.RUNNING)
    setup = make_instance(job, state=InstanceState.RUNNING, registered=True)
    body = protocol.to_dict(protocol.Heartbeat(step=7, loss=0.5))
    racers = 8
    start = threading.Barrier(racers)

    def send(_):
        start.wait()
        return requests.post(web_server.url + protocol.API_PREFIX + protocol.PATH_HEARTBEAT, json=body, timeout=30,
                             headers={"Authorization": f"Bearer {setup.agent_token}"})

    with ThreadPoolExecutor(racers) as pool:
        answers = list(pool.map(send, range(racers)))
    assert [a.status_code for a in answers] == [200] * racers, [a.text for a in answers]
    assert {a.json()["action"] for a in answers} == {"continue"}
    assert MetricPoint.objects.filter(instance=setup.instance).count() == 1
    assert ProcessedEvent.objects.filter(event_id=body["event_id"]).count() == 1
    assert Instance.objects.get(pk=setup.instance.pk).last_step == Job.objects.get(pk=job.pk).last_step == 7


def test_notice_then_checkpoint_before_deadline_then_exit(job, agent):
    now = timezone.now()
    notice = protocol.Notice(source="aws_imds", notice_time=now.isoformat(),
                             deadline=(now + timedelta(minutes=2)).isoformat(), raw='{"action": "terminate"}')
    assert agent.post("notice", notice).status_code == 200
    assert Instance.objects.get(pk=agent.instance.pk).state == InstanceState.PREEMPTING
    agent.post("checkpoints", checkpoint_report(job, 77, kind="notice", committed_at=(now + timedelta(seconds=5)).isoformat()))
    agent.post("exit", protocol.ExitReport(reason="preempted", exit_code=0, final_step=77))
    event = InterruptionEvent.objects.get(instance=agent.instance)
    assert event.checkpoint_saved is True and event.source == "aws_imds"
    instance = Instance.objects.get(pk=agent.instance.pk)
    assert instance.state == InstanceState.ENDED and instance.end_reason == EndReason.PREEMPTED
    job.refresh_from_db()
    assert job.status == JobStatus.RECOVERING and job.preemptions == 1 and job.newest_checkpoint.step == 77


def test_notice_checkpoint_after_deadline_is_recorded_as_missed(job, agent):
    now = timezone.now()
    agent.post("notice", protocol.Notice(source="gcp_metadata", notice_time=now.isoformat(),
                                         deadline=(now + timedelta(seconds=30)).isoformat()))
    agent.post("checkpoints", checkpoint_report(job, 5, kind="notice", committed_at=(now + timedelta(seconds=31)).isoformat()))
    assert InterruptionEvent.objects.get().checkpoint_saved is False


def test_a_notice_its_vm_exits_without_a_checkpoint_for_is_recorded_as_missed(job, agent):
    # The trainer died before its notice save committed: the agent exits with nothing to report.
    now = timezone.now()
    agent.post("notice", protocol.Notice(source="local", notice_time=now.isoformat(),
                                         deadline=(now + timedelta(seconds=8)).isoformat()))
    assert InterruptionEvent.objects.get().checkpoint_saved is None  # still saving
    agent.post("checkpoints", checkpoint_report(job, 30))
    agent.post("exit", protocol.ExitReport(reason="preempted", exit_code=1, final_step=40))
    event = InterruptionEvent.objects.get()
    assert event.checkpoint_saved is False and event.steps_lost == 10  # trained to 40, resumes from 30
    assert job.events.filter(message__startswith=f"notice missed on instance #{agent.instance.pk}").exists()


def test_a_notice_that_came_before_the_trainer_trained_a_step_is_recorded_as_losing_nothing(job, agent):
    # A trainer still importing its libraries dies of the notice's stop signal: no checkpoint,
    # and none needed; the job's events must not say work was missed.
    now = timezone.now()
    agent.post("checkpoints", checkpoint_report(job, 30))
    agent.post("notice", protocol.Notice(source="local", notice_time=now.isoformat(),
                                         deadline=(now + timedelta(seconds=8)).isoformat()))
    agent.post("exit", protocol.ExitReport(reason="preempted", exit_code=-15, final_step=30))
    event = InterruptionEvent.objects.get()
    assert event.checkpoint_saved is False and event.steps_lost == 0
    assert not job.events.filter(message__startswith="notice missed").exists()
    assert job.events.filter(message__startswith=f"notice on instance #{agent.instance.pk} met no checkpoint, "
                                                 "and needed none").exists()


def test_validation_marks_newest_valid(job, agent):
    report = checkpoint_report(job, 30)
    agent.post("checkpoints", report)
    response = agent.post(f"checkpoints/{report.checkpoint_id}/validation",
                          protocol.ValidationReport(result="valid", loss=1.0, reference_loss=1.0))
    assert response.status_code == 200
    job.refresh_from_db()
    assert job.newest_valid_checkpoint.step == 30


def test_validation_of_another_jobs_checkpoint_is_404(job, agent):
    setup = make_team_with_members("other")
    other_job = make_job(setup.team, setup.people["member"].user, status=JobStatus.PROVISIONING)
    other = AgentClient()
    other.register(make_instance(other_job).bootstrap_token)
    report = checkpoint_report(other_job, 1)
    assert other.post("checkpoints", report).status_code == 200
    response = agent.post(f"checkpoints/{report.checkpoint_id}/validation", protocol.ValidationReport(result="valid"))
    assert response.status_code == 404


def test_completed_exit_succeeds_the_job(job, agent):
    agent.post("exit", protocol.ExitReport(reason="completed", exit_code=0, final_step=1000,
                                           artifact_uri="/ckpt/final.safetensors", artifact_digest="sha256:aa"))
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED and job.artifact_uri == "/ckpt/final.safetensors"


def test_user_code_failing_the_same_way_twice_fails_the_job(job, agent):
    crash = dict(reason="failed", exit_code=1, last_exception="ValueError: bad batch", output_tail="Traceback...")
    agent.post("exit", protocol.ExitReport(**crash))
    job.refresh_from_db()
    assert job.status == JobStatus.RECOVERING and job.failure_restarts == 1 and job.preemptions == 0
    Job.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING)
    second = AgentClient()
    second.register(make_instance(job).bootstrap_token)
    Job.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING)
    second.post("exit", protocol.ExitReport(**crash))
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and job.failure_cause == FailureCause.USER_CODE
    assert "ValueError: bad batch" in job.failure_message


def test_ended_instance_is_told_to_stop_and_keeps_reporting_within_grace(agent, settings):
    Instance.objects.filter(pk=agent.instance.pk).update(state=InstanceState.ENDED, end_reason=EndReason.FENCED,
                                                         ended_at=timezone.now())
    assert agent.post("heartbeat", protocol.Heartbeat(step=3)).json()["action"] == "stop"
    assert agent.post("logs", protocol.LogBatch(offset=0, lines=["late line"])).status_code == 200
    settings.RESPAWN = {**settings.RESPAWN, "FENCE_GRACE_S": 0.0}
    assert agent.post("logs", protocol.LogBatch(offset=1, lines=["too late"])).status_code == 401


def test_a_gang_notice_lets_the_other_nodes_train_on_until_no_spares_are_coming_then_stops_them_all(db):
    from respawn_server.jobs.recovery.spares import end_notice_hold

    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, nodes=2, status=JobStatus.PROVISIONING)
    agents, nodes = [], []
    for rank in range(2):
        client, node = AgentClient(), make_instance(job, rank=rank)
        answer = client.register(node.bootstrap_token)
        assert answer.status_code == 200
        assert answer.json()["job"]["notice_hold"] is True  # every training node holds a notice for its spares
        agents.append(client)
        nodes.append(node.instance)
    assert Job.objects.get(pk=job.pk).status == JobStatus.RUNNING
    agents[1].post("notice", protocol.Notice(source="local", notice_time=timezone.now().isoformat()))
    # The gang's spares are being placed (respawn_server.jobs.recovery.spares.launch_spare): the peer trains on.
    assert agents[0].post("heartbeat", protocol.Heartbeat(step=9)).json()["action"] == "continue"
    end_notice_hold(nodes[1].pk)  # what launch_spare does when none can be placed
    assert agents[0].post("heartbeat", protocol.Heartbeat(step=10)).json()["action"] == "checkpoint_and_stop"
    assert agents[1].post("heartbeat", protocol.Heartbeat(step=10)).json()["action"] == "checkpoint_and_stop"


def test_processed_events_record_every_report(agent):
    agent.post("heartbeat", protocol.Heartbeat(step=1))
    assert ProcessedEvent.objects.filter(instance=agent.instance, kind="heartbeat").count() == 1
