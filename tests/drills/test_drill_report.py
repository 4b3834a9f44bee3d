"""The drill report: each phase in seconds after the interruption, steps lost, and the
verdict against the notice window with the cause named; and `respawn drill` over the
people's API (in process, through the test client)."""

import json
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from respawn_server.jobs.core.choices import (CheckpointKind, DrillStatus, InstanceState, InterruptionKind, JobStatus,
                                               ValidationResult)
from respawn_server.jobs.drills import report
from respawn_server.jobs.models import Checkpoint, Drill, Instance, InterruptionEvent, MetricPoint
from respawn.cli import commands
from respawn.cli.__main__ import main
from respawn.cli.errors import EXIT_FAILED, CliError
from tests.api.clients import client_for
from tests.factories import make_instance, make_job, make_team_with_members

T0 = timezone.now() - timedelta(minutes=10)


@pytest.fixture
def setup(db):
    return make_team_with_members()


def at(seconds):
    return T0 + timedelta(seconds=seconds)


def a_drill(setup, *, save_after_s, save_bytes=31e9, save_s=28.0, window_s=25.0):
    """A sent drill at T0 whose recovery the rows below tell: the notice seen after 1 s, the
    notice save `save_after_s` after the notice, a replacement booted, training again."""
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING)
    old = make_instance(job, state=InstanceState.ENDED, end_reason="preempted", last_step=130).instance
    Instance.objects.filter(pk=old.pk).update(requested_at=at(-100))
    drill = Drill.objects.create(job=job, instance=old, requested_by=setup.people["member"].user,
                                 status=DrillStatus.SENT, interrupted_at=T0)
    notice = InterruptionEvent.objects.create(instance=old, kind=InterruptionKind.NOTICE, source="aws_imds",
                                              notice_time=at(1), deadline=at(1 + window_s))
    InterruptionEvent.objects.filter(pk=notice.pk).update(received_at=at(1))
    save = Checkpoint.objects.create(checkpoint_id=uuid.uuid4(), job=job, instance=old, step=120, uri="/c",
                                     bytes=int(save_bytes), manifest_digest="d", kind=CheckpointKind.NOTICE,
                                     committed_at=at(1 + save_after_s), save_s=save_s)
    notice.checkpoint_saved = save_after_s <= window_s
    notice.save(update_fields=["checkpoint_saved"])
    new = make_instance(job, state=InstanceState.RUNNING, resume_checkpoint=save, registered_at=at(40)).instance
    Instance.objects.filter(pk=new.pk).update(requested_at=at(3))
    MetricPoint.objects.create(job=job, instance=new, time=at(55), step=121)
    return drill


def test_a_save_in_the_window_passes_with_each_phase_timed(setup):
    got = report.as_report(a_drill(setup, save_after_s=9.0))
    assert got["passed"] is True and got["status"] == DrillStatus.PASSED and got["cause"] == ""
    assert got["notice_seen_after_s"] == 1.0 and got["save_committed_after_s"] == 10.0
    assert got["replacement_requested_after_s"] == 3.0 and got["replacement_booted_after_s"] == 40.0
    assert got["training_again_after_s"] == 55.0
    assert got["steps_lost"] == 10 and got["window_s"] == 25.0


def test_a_late_save_fails_naming_the_window_the_overrun_and_the_checkpoint(setup):
    got = report.recovery(a_drill(setup, save_after_s=29.0, save_bytes=31e9, save_s=28.2))
    assert got.status == DrillStatus.FAILED
    assert got.cause == "notice save missed the 25 s window by 4 s: checkpoint of 31.0 GB at 1.1 GB/s"


def test_a_drill_still_recovering_is_not_judged(setup):
    drill = a_drill(setup, save_after_s=9.0)
    MetricPoint.objects.all().delete()
    got = report.recovery(drill)
    assert got.status == DrillStatus.SENT and got.save_committed_at is not None and got.training_again_at is None


def test_the_report_is_derived_when_read_so_a_later_validation_shows(setup):
    # Read once judged (passed, nothing validated yet); the resume checkpoint is then
    # validated: the next read shows it, and nothing about the drill was stored meanwhile.
    drill = a_drill(setup, save_after_s=9.0)
    first = report.as_report(drill)
    assert first["passed"] is True and first["validated_after_s"] is None
    Checkpoint.objects.filter(kind=CheckpointKind.NOTICE).update(validation=ValidationResult.VALID,
                                                                validated_at=at(48))
    again = report.as_report(Drill.objects.get(pk=drill.pk))
    assert again["validated_after_s"] == 48.0 and again["passed"] is True
    assert Drill.objects.get(pk=drill.pk).status == DrillStatus.SENT  # the verdict is the report's, never stored


def test_a_replacement_registering_after_a_read_is_judged_on_the_next(setup):
    drill = a_drill(setup, save_after_s=9.0)
    replacement = Instance.objects.get(job=drill.job, state=InstanceState.RUNNING)
    Instance.objects.filter(pk=replacement.pk).update(registered_at=None)
    first = report.as_report(drill)
    assert first["status"] == DrillStatus.SENT and first["replacement_booted_after_s"] is None
    Instance.objects.filter(pk=replacement.pk).update(registered_at=at(40))
    again = report.as_report(drill)
    assert again["status"] == DrillStatus.PASSED and again["replacement_booted_after_s"] == 40.0


def test_a_gang_trains_again_when_any_new_node_steps_and_loses_what_its_furthest_node_reached(setup):
    # Node 1 of a gang is drilled; rank 0 reports the gang's steps, so training again is
    # rank 0's new node stepping, and the steps lost are counted from rank 0's reach.
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING, nodes=2)
    old = [make_instance(job, rank=rank, state=InstanceState.ENDED, last_step=140 if rank == 0 else 0).instance
           for rank in range(2)]
    Instance.objects.filter(pk__in=[i.pk for i in old]).update(requested_at=at(-100), ended_at=at(20))
    drill = Drill.objects.create(job=job, instance=old[1], rank=1, requested_by=setup.people["member"].user,
                                 status=DrillStatus.SENT, interrupted_at=T0, with_notice=False)
    resume = Checkpoint.objects.create(checkpoint_id=uuid.uuid4(), job=job, instance=old[0], step=125, uri="/c",
                                       bytes=1, manifest_digest="d", committed_at=at(-30))
    new = [make_instance(job, rank=rank, state=InstanceState.RUNNING, resume_checkpoint=resume,
                         registered_at=at(30)).instance for rank in range(2)]
    Instance.objects.filter(pk__in=[i.pk for i in new]).update(requested_at=at(5))
    assert report.recovery(drill).status == DrillStatus.SENT  # nobody has stepped yet
    MetricPoint.objects.create(job=job, instance=new[0], time=at(50), step=126)
    got = report.recovery(drill)
    assert got.status == DrillStatus.PASSED and got.training_again_at == at(50) and got.steps_lost == 15


class InProcessApi:
    """What respawn.cli.api.Api does, through the DRF test client as `person`."""

    def __init__(self, person):
        self.client = client_for(person)

    def get(self, path, **params):
        return self.client.get(f"/api/v1/{path}", params).json()

    def all_pages(self, path, **params):
        page = self.get(path, limit=200, **params)
        assert not page["next"], "one page is all these tests make"
        return page["results"]

    def post(self, path, body=None):
        answer = self.client.post(f"/api/v1/{path}", body, format="json")
        if answer.status_code == 409:
            raise CliError(answer.json()["detail"], exit_code=EXIT_FAILED)
        return answer.json()


def test_the_cli_drills_a_node_and_reports_it(setup, monkeypatch, capsys):
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING, nodes=2)
    for rank in range(2):
        make_instance(job, rank=rank, state=InstanceState.RUNNING, provider_instance_id=f"vm-{rank}")
    monkeypatch.setattr(commands, "api", lambda args: InProcessApi(setup.people["member"]))

    assert main(["drill", str(job.pk), "--node", "1", "--without-notice", "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["rank"] == 1 and made["with_notice"] is False
    assert main(["drill", str(job.pk)]) == EXIT_FAILED  # one at a time
    assert "cannot be drilled now" in capsys.readouterr().err
    assert main(["drill", str(job.pk), "--report"]) == 0
    assert f"drill {made['id']} (node 1, without notice" in capsys.readouterr().out
