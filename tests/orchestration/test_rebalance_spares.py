"""A spare launched on an AWS rebalance recommendation (docs/spares.md, "Rebalance
recommendations"), for a job with spare_on_rebalance: the instance trains on, the spare
boots, and once it is ready the instance saves and hands over, a planned move that
counts no preemption. In the control plane's own code, through the agent API where the
agent's word arrives, on the local provider's price book."""

import datetime as dt
import uuid

import pytest
from django.db import transaction
from django.utils import timezone

from respawn import protocol
from respawn.protocol import Action
from respawn_server.jobs.core.choices import EndReason, InstanceState, JobStatus
from respawn_server.jobs.fleet.reconciler import retry_stuck_provisioning
from respawn_server.jobs.models import Instance, InterruptionEvent, Job
from respawn_server.jobs.recovery.spares import end_notice_hold, launch_spare, release_stale_spares
from respawn_server.jobs.reports.checkpoints import record_checkpoint
from respawn_server.jobs.reports.notices import record_notice
from respawn_server.jobs.reports.registration import register_instance
from tests.agent_api.helpers import AgentClient
from tests.factories import make_instance, make_job, make_team_with_members


@pytest.fixture
def running(settings, db):
    """A running one-node job with spare_on_rebalance, its VM in local-a, registered."""
    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": ["local"]}
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, allowed_clouds=["local"], status=JobStatus.RUNNING,
                   spare_on_rebalance=True)
    made = make_instance(job, state=InstanceState.RUNNING, zone="local-a", registered=True)
    return job, made, setup


def recommend(made, **body):
    return AgentClient(made.agent_token).post(protocol.PATH_NOTICE, {
        "event_id": str(uuid.uuid4()), "source": "aws_imds", "notice_time": timezone.now().isoformat(),
        "kind": "rebalance", "raw": '{"noticeTime": "2026-12-02T07:00:00Z"}', **body})


def ready_spare(old: Instance) -> Instance:
    """The spare launched for `old`, registered and asking `standby` (it is prepared)."""
    spare = Instance.objects.get(pk__in=launch_spare(old.pk))
    with transaction.atomic():
        register_instance(spare, hostname="spare", agent_version="t", provider_instance_id="")
    return spare


def test_a_recommendation_launches_a_spare_and_the_instance_trains_on(running, django_capture_on_commit_callbacks):
    job, made, setup = running
    with django_capture_on_commit_callbacks() as callbacks:
        answer = recommend(made)
    assert answer.status_code == 200, answer.content
    assert callbacks, "no spare launch was queued"
    old = Instance.objects.get(pk=made.instance.pk)
    # Not an interruption: the instance runs on, untold to save or hold, and nothing is counted.
    assert (old.state, old.requested_action) == (InstanceState.RUNNING, "")
    assert not InterruptionEvent.objects.filter(instance=old).exists()
    spare = Instance.objects.get(pk__in=launch_spare(old.pk))
    assert (spare.standby_for_id, spare.state) == (old.pk, InstanceState.REQUESTED)
    assert spare.zone != old.zone  # the recommended zone counts as just preempted
    assert launch_spare(old.pk) == []  # one spare an instance
    assert job.events.filter(message__contains="rebalance recommendation of instance").exists()
    assert Instance.objects.get(pk=old.pk).requested_action == ""  # still training


def test_the_ready_spare_takes_over_from_the_handover_save_and_no_preemption_is_counted(
        running, django_capture_on_commit_callbacks):
    job, made, setup = running
    recommend(made)
    old = made.instance
    spare = ready_spare(old)
    with transaction.atomic():
        end_notice_hold(old.pk, spare_ready=True)  # what the spare's GET standby does
    assert Instance.objects.get(pk=old.pk).requested_action == Action.CHECKPOINT_AND_STOP
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        save, _ = record_checkpoint(Instance.objects.get(pk=old.pk), checkpoint_id=uuid.uuid4(), step=90,
                                    uri="/c/90", bytes=1, manifest_digest="d", kind="notice",
                                    committed_at=timezone.now())
    old.refresh_from_db()
    spare.refresh_from_db()
    job.refresh_from_db()
    assert (old.state, old.end_reason) == (InstanceState.ENDED, EndReason.FENCED)
    assert (spare.standby_for_id, spare.resume_checkpoint_id) == (None, save.pk)
    assert (job.status, job.preemptions) == (JobStatus.RUNNING, 0)
    assert job.events.filter(message__contains="the price of the overlap").exists()


def test_a_notice_after_the_recommendation_waits_for_the_same_spare(running):
    job, made, setup = running
    recommend(made)
    old = made.instance
    spare = Instance.objects.get(pk__in=launch_spare(old.pk))
    now = timezone.now()
    with transaction.atomic():
        record_notice(Instance.objects.get(pk=old.pk), source="aws_imds", notice_time=now,
                      deadline=now + dt.timedelta(seconds=120), raw="")
    assert Instance.objects.get(pk=spare.pk).requested_action == ""  # the spare is not told to save and stop
    assert launch_spare(old.pk) == []  # no second spare
    assert Instance.objects.get(pk=old.pk).requested_action == Action.HOLD  # the noticed VM trains on for it
    assert Instance.objects.filter(standby_for=old).count() == 1


def test_a_spare_that_never_registers_leaves_the_instance_training(running):
    job, made, setup = running
    recommend(made)
    old = made.instance
    spare = Instance.objects.get(pk__in=launch_spare(old.pk))
    Instance.objects.filter(pk=spare.pk).update(requested_at=timezone.now() - dt.timedelta(hours=1))
    retry_stuck_provisioning()
    spare.refresh_from_db()
    assert (spare.state, spare.end_reason) == (InstanceState.ENDED, EndReason.CAPACITY_ERROR)
    old.refresh_from_db()
    assert (old.state, old.requested_action) == (InstanceState.RUNNING, "")  # not told to stop: nothing replaces it
    assert Job.objects.get(pk=job.pk).status == JobStatus.RUNNING


def test_an_instance_that_does_not_stop_for_its_ready_spare_keeps_its_slot(running, settings):
    job, made, setup = running
    recommend(made)
    old = made.instance
    spare = ready_spare(old)
    with transaction.atomic():
        end_notice_hold(old.pk, spare_ready=True)
    assert release_stale_spares() == 0  # it has its save budget to stop
    Instance.objects.filter(pk=old.pk).update(requested_action_at=timezone.now() - dt.timedelta(hours=1))
    assert release_stale_spares() == 1
    spare.refresh_from_db()
    assert (spare.state, spare.end_reason) == (InstanceState.ENDED, EndReason.FENCED)
    assert job.events.filter(message__contains="did not stop when its spare was ready").exists()
    assert Instance.objects.get(pk=old.pk).state == InstanceState.RUNNING


@pytest.mark.parametrize("change", [{"spare_on_rebalance": False}, {"nodes": 2}])
def test_a_recommendation_is_only_noted_for_a_job_that_did_not_ask_or_a_gang(running, change,
                                                                            django_capture_on_commit_callbacks):
    job, made, setup = running
    Job.objects.filter(pk=job.pk).update(**change)
    with django_capture_on_commit_callbacks() as callbacks:
        assert recommend(made).status_code == 200
    assert not callbacks and not Instance.objects.filter(standby_for=made.instance).exists()
    assert job.events.filter(message__contains="noted, no spare").exists()


def test_a_resent_recommendation_is_applied_once_and_a_bad_kind_is_a_400_naming_it(running):
    job, made, setup = running
    event_id = str(uuid.uuid4())
    assert recommend(made, event_id=event_id).status_code == 200
    assert recommend(made, event_id=event_id).json().get("duplicate") is True
    assert job.events.filter(message__contains="rebalance recommendation from aws_imds").count() == 1
    bad = recommend(made, kind="maybe")
    assert bad.status_code == 400 and "kind" in bad.json()["errors"]


def test_spare_on_rebalance_is_refused_for_a_gang(running):
    from tests.api.clients import client_for

    job, made, setup = running
    answer = client_for(setup.people["member"]).post("/api/v1/jobs/", {
        "team": job.team_id, "name": "gang", "command": ["python", "train.py"], "nodes": 2,
        "allowed_clouds": ["local"], "spare_on_rebalance": True}, format="json")
    assert answer.status_code == 400 and "spare_on_rebalance" in answer.json()["errors"], answer.content
