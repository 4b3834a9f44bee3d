"""Each interruption's downtime split into save, capacity, boot, validation and restore
(respawn_server.jobs.money.downtime): the pure split, and the parts read from a recorded timeline."""

import datetime as dt
import uuid

import pytest
from rest_framework.test import APIClient

from respawn.protocol import CheckpointKind
from respawn_server.jobs.core.choices import EndReason, InstanceState, InterruptionKind
from respawn_server.jobs.models import Checkpoint, Instance, InterruptionEvent, MetricPoint
from respawn_server.jobs.money.downtime import Timeline, job_downtime, split, total_s
from tests.factories import make_instance, make_job, make_team_with_members

T0 = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def test_a_serial_recovery_is_split_mark_by_mark_and_adds_up():
    t = Timeline(instance_id=1, kind="notice", interrupted=at(0), saved=at(20), requested=at(130), registered=at(250),
                 validated=at(260), resumed=at(300))
    d = split(t, now=at(1000))
    assert d.parts == {"save": 20, "capacity": 110, "boot": 120, "validation": 10, "restore": 40}
    assert d.total_s == 300 and not d.ongoing


def test_a_spare_booted_during_the_notice_leaves_only_save_and_restore():
    # Requested and registered while the old VM still saved: capacity and boot are off the path.
    t = Timeline(instance_id=1, kind="notice", interrupted=at(0), saved=at(20), requested=at(1), registered=at(15),
                 resumed=at(30))
    assert split(t, now=at(99)).parts == {"save": 20, "capacity": 0, "boot": 0, "validation": 0, "restore": 10}


def test_a_verdict_nobody_waited_for_is_no_part():
    before = Timeline(instance_id=1, kind="notice", interrupted=at(0), requested=at(10), registered=at(50),
                      validated=at(40), resumed=at(60))
    after = Timeline(instance_id=1, kind="notice", interrupted=at(0), requested=at(10), registered=at(50),
                     validated=at(70), resumed=at(60))
    for t in (before, after):
        assert split(t, now=at(99)).parts == {"save": 0, "capacity": 10, "boot": 40, "validation": 0, "restore": 10}


def test_an_open_interruption_is_in_the_part_it_has_not_passed():
    t = Timeline(instance_id=1, kind="preempted", interrupted=at(0), requested=at(10))
    d = split(t, now=at(100))
    assert d.parts == {"save": 0, "capacity": 10, "boot": 90, "validation": 0, "restore": 0}
    assert d.ongoing and d.total_s == 100


def test_the_job_total_counts_overlapping_interruptions_once():
    spans = [split(Timeline(instance_id=i, kind="notice", interrupted=at(a), requested=at(a), registered=at(a),
                            resumed=at(b)), now=at(500)) for i, (a, b) in enumerate([(0, 100), (50, 150), (200, 210)])]
    assert total_s(spans, now=at(500)) == 160


def _checkpoint(instance, step, kind, committed, validated=None):
    return Checkpoint.objects.create(checkpoint_id=uuid.uuid4(), job_id=instance.job_id, instance=instance, step=step,
                                     uri=f"/c/{step}", bytes=1, manifest_digest="d", kind=kind,
                                     committed_at=committed, validation="valid", validated_at=validated)


def _beats(instance, *points):
    MetricPoint.objects.bulk_create([MetricPoint(job_id=instance.job_id, instance=instance, time=at(s), step=step)
                                     for s, step in points])


@pytest.fixture
def recorded(db):
    """A noticed preemption and a silent loss, with the timestamps the control plane
    records for them (a notice at 100 s, its checkpoint at 112 s, ...)."""
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user)
    old = make_instance(job, state=InstanceState.ENDED).instance
    _beats(old, (10, 0), (90, 80))
    InterruptionEvent.objects.create(instance=old, kind=InterruptionKind.NOTICE, source="local",
                                     notice_time=at(100), deadline=at(220))
    notice_ckpt = _checkpoint(old, 90, CheckpointKind.NOTICE, at(112), validated=at(175))
    Instance.objects.filter(pk=old.pk).update(end_reason=EndReason.PREEMPTED, ended_at=at(115))
    new = make_instance(job, state=InstanceState.ENDED).instance
    Instance.objects.filter(pk=new.pk).update(requested_at=at(120), registered_at=at(170),
                                              resume_checkpoint=notice_ckpt, end_reason=EndReason.LOST,
                                              ended_at=at(400))
    _beats(new, (171, 90), (190, 91), (300, 150))
    InterruptionEvent.objects.create(instance=new, kind=InterruptionKind.LOST, source="heartbeat_timeout")
    third = make_instance(job, state=InstanceState.RUNNING).instance
    Instance.objects.filter(pk=third.pk).update(requested_at=at(410), registered_at=at(460),
                                                resume_checkpoint=notice_ckpt)
    return setup, job, old, new, third


def test_parts_are_read_from_a_recorded_timeline(recorded):
    setup, job, old, new, third = recorded
    total, (noticed, lost) = job_downtime(job.pk, now=at(500))
    assert (noticed.instance_id, noticed.replacement_id, noticed.kind) == (old.pk, new.pk, "notice")
    assert noticed.parts == {"save": 12, "capacity": 8, "boot": 50, "validation": 5, "restore": 15}
    # Lost without a notice: from its last heartbeat; its replacement has not trained yet.
    assert (lost.instance_id, lost.kind, lost.interrupted, lost.resumed) == (new.pk, "lost", at(300), None)
    assert lost.parts == {"save": 0, "capacity": 110, "boot": 50, "validation": 0, "restore": 40}
    assert total == 90 + 200


def test_the_job_detail_answers_the_downtime(recorded):
    setup, job, old, new, third = recorded
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {setup.people['viewer'].token}")
    body = client.get(f"/api/v1/jobs/{job.pk}/").json()
    assert body["downtime_s"] > 290
    first = body["interruptions"][0]
    assert (first["instance"], first["replacement"], first["kind"], first["ongoing"]) == (old.pk, new.pk, "notice",
                                                                                           False)
    assert first["parts"] == {"save": 12.0, "capacity": 8.0, "boot": 50.0, "validation": 5.0, "restore": 15.0}
    assert first["downtime_s"] == 90.0
    assert (first["resume_step"], first["resume_tier"]) == (90, "storage")  # the notice's checkpoint
    assert body["interruptions"][1]["ongoing"] is True
    listed = client.get("/api/v1/jobs/").json()["results"][0]
    assert "interruptions" not in listed  # the list stays one query per page, not per job


def noticed_at(job):
    return job_downtime(job.pk, now=at(500))[1][0].interrupted


def test_the_job_page_shows_the_total_and_each_interruptions_parts(recorded, client):
    setup, job, old, new, third = recorded
    client.force_login(setup.people["viewer"].user)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="downtime-table"' in html
    table = html.split('id="downtime-table"')[1].split("</table>")[0]
    rows = table.split("<tr>")[2:]
    assert f"#{old.pk} notice → #{new.pk}" in rows[0]
    interrupted = rows[0].split("</td>")[0]  # as people read a moment, the machine-readable one beside it
    assert f">{noticed_at(job):%Y-%m-%d %H:%M:%S} UTC</time>" in interrupted and "+00:00</time>" not in interrupted
    assert [c.split(">")[-1] for c in rows[0].split("</td>")[2:9]] == ["12", "8", "50", "5", "15", "90", "step 90 (storage)"]
    assert "(ongoing)" in rows[1]
    assert 'id="downtime"' in html


def test_where_an_interruptions_work_went_on_from_in_words():
    from respawn_server.frontend.story import where_resumed

    assert [where_resumed(step, tier) for step, tier in ((90, "storage"), (42, "memory"), (0, ""), (None, ""))] == [
        "step 90 (storage)", "step 42 (memory tier)", "the start", ""]
