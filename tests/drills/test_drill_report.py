"""The drill report: each phase in seconds after the interruption, steps lost, and the
verdict against the notice window with the cause named; and `respawn drill` over the
people's API (in process, through the test client)."""

import json
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from respawn_server.jobs.core.choices import CheckpointKind, DrillStatus, InstanceState, InterruptionKind, JobStatus
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
    drill = report.refresh(a_drill(setup, save_after_s=9.0))
    got = report.as_report(drill)
    assert got["passed"] is True and got["status"] == DrillStatus.PASSED and got["cause"] == ""
    assert got["notice_seen_after_s"] == 1.0 and got["save_committed_after_s"] == 10.0
    assert got["replacement_requested_after_s"] == 3.0 and got["replacement_booted_after_s"] == 40.0
    assert got["training_again_after_s"] == 55.0
    assert got["steps_lost"] == 10 and got["window_s"] == 25.0


def test_a_late_save_fails_naming_the_window_the_overrun_and_the_checkpoint(setup):
    drill = report.refresh(a_drill(setup, save_after_s=29.0, save_bytes=31e9, save_s=28.2))
    assert drill.status == DrillStatus.FAILED
    assert drill.cause == "notice save missed the 25 s window by 4 s: checkpoint of 31.0 GB at 1.1 GB/s"


def test_a_drill_still_recovering_is_not_judged(setup):
    drill = a_drill(setup, save_after_s=9.0)
    MetricPoint.objects.all().delete()
    drill = report.refresh(drill)
    assert drill.status == DrillStatus.SENT and drill.save_committed_at is not None


class InProcessApi:
    """What respawn.cli.api.Api does, through the DRF test client as `person`."""

    def __init__(self, person):
        self.client = client_for(person)

    def get(self, path, **params):
        return self.client.get(f"/api/v1/{path}", params).json()

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
