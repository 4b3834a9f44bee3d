"""`POST metrics`: every step the trainer reported, for the job's loss curve (DESIGN §5's
rules: applied once per event_id, 400 naming a bad field, a token writes only its own
instance's points)."""

import datetime as dt
import uuid

import pytest
from django.utils import timezone

from respawn import protocol
from respawn_server.jobs.core.choices import EndReason, InstanceState, JobStatus
from respawn_server.jobs.models import Checkpoint, Job, StepPoint
from tests.agent_api.helpers import AgentClient, checkpoint_report
from tests.factories import make_instance, make_job, make_team_with_members

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def points(steps, loss=lambda step: 2.0 / (step + 1)) -> list[protocol.StepMetric]:
    return [protocol.StepMetric(step=s, time=(T0 + dt.timedelta(seconds=s)).isoformat(), loss=loss(s),
                                samples_per_s=64.0) for s in steps]


def registered(job) -> AgentClient:
    setup = make_instance(job)
    client = AgentClient()
    assert client.register(setup.bootstrap_token).status_code == 200
    client.instance = setup.instance
    return client


@pytest.fixture
def job(db):
    setup = make_team_with_members()
    return make_job(setup.team, setup.people["member"].user, status=JobStatus.PROVISIONING)


def test_it_stores_every_step_of_a_batch_once(job):
    agent = registered(job)
    batch = protocol.MetricsBatch(points=points(range(1, 101)))
    first = agent.post(protocol.PATH_METRICS, batch)
    assert first.status_code == 200 and first.json() == {"ok": True, "duplicate": False}
    assert agent.post(protocol.PATH_METRICS, batch).json()["duplicate"] is True
    # Another batch repeating steps (a restarted agent reading the file again) adds only the new ones.
    agent.post(protocol.PATH_METRICS, protocol.MetricsBatch(points=points(range(90, 121))))
    rows = list(StepPoint.objects.filter(job=job).order_by("step").values_list("step", "loss", "time", "instance"))
    assert [r[0] for r in rows] == list(range(1, 121))
    assert rows[0][1:] == (1.0, T0 + dt.timedelta(seconds=1), agent.instance.pk)


@pytest.mark.parametrize(("body", "field"), [
    ({"points": []}, "points"),
    ({"points": [{"step": 1, "time": T0.isoformat()}] * (protocol.MAX_METRIC_POINTS_PER_BATCH + 1)}, "points"),
    ({"points": [{"step": -1, "time": T0.isoformat()}]}, "points"),
    ({"points": [{"step": 2**63, "time": T0.isoformat()}]}, "points"),
    ({"points": [{"step": 1}]}, "points"),
    ({"points": [{"step": 1, "time": T0.isoformat(), "samples_per_s": -3}]}, "points"),
    ({"points": [{"step": 1, "time": T0.isoformat(), "loss": "NaN"}]}, "points"),
    ({"points": "many"}, "points"),
])
def test_it_refuses_a_bad_field_naming_it(job, body, field):
    agent = registered(job)
    response = agent.post(protocol.PATH_METRICS, {"event_id": str(uuid.uuid4()), **body})
    assert response.status_code == 400 and field in response.json()["errors"], response.content
    without_event = agent.post(protocol.PATH_METRICS, protocol.to_dict(protocol.MetricsBatch(points=points([1])))
                               | {"event_id": "not-a-uuid"})
    assert without_event.status_code == 400 and "event_id" in without_event.json()["errors"]
    assert not StepPoint.objects.exists()


def test_a_step_beyond_the_jobs_total_is_refused_naming_points(job):
    # The loss curve's axis is the job's steps: a point at step 10**9 of a 1000-step job is
    # no step its trainer made, and would stretch every chart of the job.
    agent = registered(job)
    refused = agent.post(protocol.PATH_METRICS, protocol.MetricsBatch(points=points([999, 1000, 10**9])))
    assert refused.status_code == 400 and "total_steps (1000)" in str(refused.json()["errors"]["points"])
    assert not StepPoint.objects.exists()
    assert agent.post(protocol.PATH_METRICS, protocol.MetricsBatch(points=points([999, 1000]))).status_code == 200


def test_a_token_writes_only_its_own_instance_and_a_fenced_one_nothing(job):
    setup = make_team_with_members("other")
    other_job = make_job(setup.team, setup.people["member"].user, status=JobStatus.PROVISIONING)
    mine, theirs = registered(job), registered(other_job)
    theirs.post(protocol.PATH_METRICS, protocol.MetricsBatch(points=points([5])))
    assert list(StepPoint.objects.values_list("job", "instance")) == [(other_job.pk, theirs.instance.pk)]
    assert AgentClient("rsa_wrong").post(protocol.PATH_METRICS,
                                         protocol.MetricsBatch(points=points([6]))).status_code == 401
    type(mine.instance).objects.filter(pk=mine.instance.pk).update(
        state=InstanceState.ENDED, end_reason=EndReason.FENCED, ended_at=timezone.now())
    assert mine.post(protocol.PATH_METRICS, protocol.MetricsBatch(points=points([7]))).status_code == 401
    assert not StepPoint.objects.filter(job=job).exists()


@pytest.mark.parametrize("reason", [EndReason.CANCELLED, EndReason.PREEMPTED])
def test_a_cancelled_or_preempted_instances_last_steps_land_within_its_grace_window_and_not_after(job, reason,
                                                                                                  settings):
    """`make demo`'s Ctrl-C ends each instance `cancelled` before its VM flushes its last
    steps: they land, as its last checkpoint does, while its token's grace window lasts."""
    agent = registered(job)
    Instance = type(agent.instance)
    Instance.objects.filter(pk=agent.instance.pk).update(state=InstanceState.ENDED, end_reason=reason,
                                                         ended_at=timezone.now())
    assert agent.post(protocol.PATH_METRICS, protocol.MetricsBatch(points=points([1, 2]))).status_code == 200
    assert agent.post(protocol.PATH_HEARTBEAT, protocol.Heartbeat(step=3)).json()["action"] == protocol.Action.STOP
    assert agent.post(protocol.PATH_NOTICE, protocol.Notice(source="sigterm", notice_time=T0.isoformat())).status_code == 401  # no more than that
    Instance.objects.filter(pk=agent.instance.pk).update(
        ended_at=timezone.now() - dt.timedelta(seconds=settings.RESPAWN["FENCE_GRACE_S"] + 1))
    assert agent.post(protocol.PATH_METRICS, protocol.MetricsBatch(points=points([3]))).status_code == 401
    assert list(StepPoint.objects.filter(job=job).values_list("instance", "step")) == [
        (agent.instance.pk, 1), (agent.instance.pk, 2)]


def test_register_says_how_the_resume_checkpoint_was_judged(job):
    first = registered(job)
    report = checkpoint_report(job, 100)
    first.post(protocol.PATH_CHECKPOINTS, report)
    first.post(protocol.PATH_VALIDATION.format(checkpoint_id=report.checkpoint_id),
               protocol.ValidationReport(result=protocol.ValidationResult.VALID))
    first.post(protocol.PATH_EXIT, protocol.ExitReport(reason="preempted", exit_code=0))
    assert Checkpoint.objects.get(step=100).validation == protocol.ValidationResult.VALID
    Job.objects.filter(pk=job.pk).update(status=JobStatus.PROVISIONING)
    spec = AgentClient().register(make_instance(job).bootstrap_token).json()["job"]
    assert (spec["resume_step"], spec["resume_validation"]) == (100, protocol.ValidationResult.VALID)
