"""The job's preemption counter counts only interruptions the cloud caused (issue 36): a
VM the control plane stops itself (the job cancelled, or `make demo` stopped on Ctrl-C)
ends `cancelled` and counts none, whatever the job's recovery was doing then, a notice
and its spares included. (A drill counts none either: tests/drills/test_drill_counting.py;
a preemption counts once: tests/orchestration/test_gang_spares.py.)

The "4 -> 5 on Ctrl-C" of issue 34, replayed with `make demo` (its market shortened): a
notice reached the VM training then, its notice save handed over to its spare within a
second (the noticed VM ended `preempted`: counted, with its notice row), and the stop
ended that spare `cancelled` with none. The count rose for the noticed VM, not for the
one stopped (test_a_stop_just_after_a_notice_counts_the_noticed_vm_once)."""

import pytest
from django.db import transaction

from respawn.protocol import Action
from respawn_server.jobs.core.choices import EndReason, InstanceState, InterruptionKind
from respawn_server.jobs.core.services import cancel_job
from respawn_server.jobs.fleet.launcher import terminate, terminate_local_vms
from respawn_server.jobs.fleet.registry import provider_for
from respawn_server.jobs.models import Instance, InterruptionEvent
from respawn_server.jobs.recovery.counting import counts_as_preemption
from respawn_server.jobs.recovery.spares import launch_spare, spare_ready
from tests.orchestration.test_gang_spares import actions, gang, launched, notice_save, register  # noqa: F401  (gang: a fixture)
from tests.orchestration.test_spares import noticed  # noqa: F401  (a fixture)


@pytest.mark.parametrize("end_reason", EndReason.ALL)
def test_only_the_clouds_ends_count(end_reason):
    assert counts_as_preemption(end_reason, None) == (end_reason in (EndReason.PREEMPTED, EndReason.LOST))


def stop_the_control_plane(job, tmp_path, settings) -> None:
    settings.RESPAWN = {**settings.RESPAWN, "PROVIDER_CONFIG": {"local": {"root": str(tmp_path / "local-vms")}}}
    provider_for.cache_clear()
    try:
        assert terminate_local_vms() == []  # no VM process here: the rows are what is judged
    finally:
        provider_for.cache_clear()


def cancel(job, tmp_path, settings) -> None:
    live = list(Instance.objects.filter(job=job, state__in=InstanceState.LIVE).values_list("pk", flat=True))
    assert cancel_job(job, by=job.owner)
    for pk in live:  # what the terminate tasks it queued run
        terminate(pk)


@pytest.mark.parametrize("stop", [stop_the_control_plane, cancel], ids=["make-demo-ctrl-c", "job-cancelled"])
def test_a_gang_stopped_by_the_control_plane_mid_notice_counts_no_preemption(gang, stop, tmp_path, settings):
    job, nodes = gang  # node 1 got a notice; its spares and node 0's are ready, the gang told to save and stop
    spares = launched(nodes)
    for spare in spares:
        register(spare)
        spare_ready(Instance.objects.get(pk=spare.pk))
    assert actions(nodes) == [Action.CHECKPOINT_AND_STOP] * len(nodes)
    with transaction.atomic():
        stop(job, tmp_path, settings)
    job.refresh_from_db()
    ended = {i.pk: i.end_reason for i in Instance.objects.filter(job=job)}
    assert set(ended.values()) <= {EndReason.CANCELLED, EndReason.FENCED}, ended
    assert job.preemptions == 0
    assert list(InterruptionEvent.objects.filter(instance__job=job).values_list("kind", flat=True)) == [
        InterruptionKind.NOTICE]


def test_a_stop_just_after_a_notice_counts_the_noticed_vm_once(noticed, tmp_path, settings,
                                                                django_capture_on_commit_callbacks):
    job, old = noticed
    [spare_id] = launch_spare(old.pk)
    register(Instance.objects.get(pk=spare_id))
    notice_save(old, django_capture_on_commit_callbacks)  # the noticed VM's save hands over to its spare
    job.refresh_from_db()
    assert Instance.objects.get(pk=old.pk).end_reason == EndReason.PREEMPTED and job.preemptions == 1
    with transaction.atomic():
        stop_the_control_plane(job, tmp_path, settings)
    job.refresh_from_db()
    spare = Instance.objects.get(pk=spare_id)
    assert (spare.end_reason, spare.interruptions.exists()) == (EndReason.CANCELLED, False)
    assert job.preemptions == 1 == Instance.objects.filter(
        job=job, end_reason__in=(EndReason.PREEMPTED, EndReason.LOST)).count()
