"""A drill's interruption is recovered from like any other and counted as none: not in the
job's preemption counter (so not against max_preemptions), not in the learned interruption
rates, not in the back-off; a real preemption of another VM meanwhile still counts. And the
task that sends a drill: sent, refused naming the permission, or retried."""

import pytest
from django.db import transaction
from django.utils import timezone

from respawn_server.jobs.core.choices import DrillStatus, EndReason, InstanceState, InterruptionKind, JobStatus
from respawn_server.jobs.recovery.after_end import after_instance_ended
from respawn_server.jobs.core.transitions import end_instance
from respawn_server.jobs.drills import services
from respawn_server.jobs.core.drilled import caused_by_drill
from respawn_server.jobs.fleet import placement
from respawn_server.jobs.fleet.providers.base import MissingPermission, TransientError
from respawn_server.jobs.models import Drill, Instance, InterruptionEvent, Job
from tests.factories import make_instance, make_job, make_team_with_members


@pytest.fixture
def setup(db):
    return make_team_with_members()


def running(setup, nodes=1):
    job = make_job(setup.team, setup.people["member"].user, status=JobStatus.RUNNING, nodes=nodes)
    nodes = [make_instance(job, rank=rank, state=InstanceState.RUNNING, running_at=timezone.now(),
                           provider_instance_id=f"vm-{rank}").instance for rank in range(nodes)]
    return job, nodes


def drilled(setup, instance, status=DrillStatus.SENT):
    return Drill.objects.create(job=instance.job, instance=instance, rank=instance.rank, status=status,
                                requested_by=setup.people["member"].user, interrupted_at=timezone.now())


def preempted(instance, *, confirmed=True):
    with transaction.atomic():
        assert end_instance(instance, EndReason.PREEMPTED, message="test")
        Instance.objects.filter(pk=instance.pk).update(preemption_confirmed=confirmed)
        after_instance_ended(instance.job_id, EndReason.PREEMPTED, instance_id=instance.pk)


def test_a_drilled_instance_s_end_recovers_the_job_without_counting_a_preemption(setup):
    job, [node] = running(setup)
    drilled(setup, node)
    preempted(node)
    job.refresh_from_db()
    assert job.status == JobStatus.RECOVERING and job.preemptions == 0


def test_a_drill_asked_for_but_refused_does_not_hide_a_real_preemption(setup):
    job, [node] = running(setup)
    drilled(setup, node, status=DrillStatus.REFUSED)
    preempted(node)
    assert Job.objects.get(pk=job.pk).preemptions == 1


def test_a_real_preemption_of_another_node_during_a_drill_still_counts(setup):
    job, [rank0, rank1] = running(setup, nodes=2)
    drilled(setup, rank0)
    preempted(rank1)
    job.refresh_from_db()
    assert job.preemptions == 1 and job.status == JobStatus.RECOVERING


def test_rates_and_back_off_learn_nothing_from_a_drill(setup):
    job, [drilled_node, real_node] = running(setup, nodes=2)
    drilled(setup, drilled_node)
    preempted(drilled_node)
    assert not placement.placement_events(timezone.now())
    assert not any(lt.interrupted for lts in placement.lifetimes(timezone.now()).values() for lt in lts)
    assert placement._just_preempted(job) is None
    Job.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING)
    preempted(real_node)
    assert [e.kind for e in placement.placement_events(timezone.now())] == ["preempted"]


class FakeProvider:
    def __init__(self, error=None):
        self.error, self.calls = error, []

    def interrupt(self, provider_instance_id, *, with_notice):
        self.calls.append((provider_instance_id, with_notice))
        if self.error:
            raise self.error
        return "experiment EXP1"


def send(monkeypatch, setup, provider, with_notice=True):
    job, [node] = running(setup)
    monkeypatch.setattr(services, "provider_for", lambda name, region="": provider)
    drill = services.request_drill(job, by=setup.people["member"].user, rank=0, with_notice=with_notice)
    return drill, node


def test_the_task_interrupts_through_the_provider_and_marks_the_timeline(monkeypatch, setup):
    provider = FakeProvider()
    drill, node = send(monkeypatch, setup, provider, with_notice=False)
    services.run_drill(drill.pk)
    services.run_drill(drill.pk)  # a second delivery of the message does nothing more
    assert provider.calls == [("vm-0", False)]
    drill.refresh_from_db()
    assert drill.status == DrillStatus.SENT and drill.interrupted_at is not None
    marker = InterruptionEvent.objects.get(instance=node, kind=InterruptionKind.DRILL)
    assert "EXP1" in marker.raw


def test_a_missing_permission_refuses_the_drill_naming_it(monkeypatch, setup):
    drill, node = send(monkeypatch, setup, FakeProvider(MissingPermission("403", permission="fis:StartExperiment")))
    services.run_drill(drill.pk)
    drill.refresh_from_db()
    assert drill.status == DrillStatus.REFUSED and drill.missing_permission == "fis:StartExperiment"
    assert "fis:StartExperiment" in drill.cause
    assert not caused_by_drill(node.pk)


def test_a_transient_failure_puts_the_drill_back_to_be_retried(monkeypatch, setup):
    drill, _ = send(monkeypatch, setup, FakeProvider(TransientError("throttled")))
    with pytest.raises(TransientError):
        services.run_drill(drill.pk)
    drill.refresh_from_db()
    assert drill.status == DrillStatus.REQUESTED
