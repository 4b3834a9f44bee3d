"""Both state machines, every pair of states: allowed ones happen once and write
an event row; forbidden ones raise and change nothing. Generated from the tables."""

import itertools

import pytest

from respawn_server.jobs.core.choices import EndReason, InstanceState, JobStatus
from respawn_server.jobs.core.transitions import IllegalTransition, transition_instance, transition_job
from respawn_server.jobs.models import Instance, InstanceEvent, Job, JobEvent
from tests.factories import make_instance, make_job, make_team_with_members

JOB_PAIRS = list(itertools.product(JobStatus.ALL, repeat=2))
INSTANCE_PAIRS = list(itertools.product(InstanceState.ALL, repeat=2))


@pytest.fixture
def job(db):
    setup = make_team_with_members()
    return make_job(setup.team, setup.people["member"].user)


@pytest.mark.parametrize("old,new", JOB_PAIRS, ids=[f"{a}->{b}" for a, b in JOB_PAIRS])
def test_job_transition_follows_the_table(job, old, new):
    Job.objects.filter(pk=job.pk).update(status=old)
    if new in JobStatus.TRANSITIONS[old]:
        assert transition_job(job.pk, old, new, message="test")
        job.refresh_from_db()
        assert job.status == new
        assert JobEvent.objects.filter(job=job, from_status=old, to_status=new).count() == 1
        # The same change again is a lost race: the guard sees the new state.
        assert not transition_job(job.pk, old, new)
        assert JobEvent.objects.filter(job=job, from_status=old, to_status=new).count() == 1
    else:
        with pytest.raises(IllegalTransition):
            transition_job(job.pk, old, new)
        job.refresh_from_db()
        assert job.status == old
        assert not JobEvent.objects.filter(job=job, to_status=new).exists()


@pytest.mark.parametrize("old,new", INSTANCE_PAIRS, ids=[f"{a}->{b}" for a, b in INSTANCE_PAIRS])
def test_instance_transition_follows_the_table(job, old, new):
    instance = make_instance(job).instance
    Instance.objects.filter(pk=instance.pk).update(state=old)
    extra = {"end_reason": EndReason.PREEMPTED} if new == InstanceState.ENDED else {}
    if new in InstanceState.TRANSITIONS[old]:
        assert transition_instance(instance.pk, old, new, **extra)
        instance.refresh_from_db()
        assert instance.state == new
        assert InstanceEvent.objects.filter(instance=instance, from_state=old, to_state=new).count() == 1
        assert not transition_instance(instance.pk, old, new, **extra)
        if new == InstanceState.ENDED:
            assert instance.end_reason == EndReason.PREEMPTED and instance.ended_at is not None
    else:
        with pytest.raises(IllegalTransition):
            transition_instance(instance.pk, old, new, **extra)
        instance.refresh_from_db()
        assert instance.state == old
        assert not InstanceEvent.objects.filter(instance=instance).exists()


def test_ending_an_instance_needs_a_reason(job):
    instance = make_instance(job).instance
    with pytest.raises(IllegalTransition, match="end_reason"):
        transition_instance(instance.pk, InstanceState.REQUESTED, InstanceState.ENDED)


def test_a_job_slot_holds_one_live_instance(job):
    from django.db import IntegrityError, transaction

    make_instance(job, rank=0)
    with pytest.raises(IntegrityError), transaction.atomic():
        make_instance(job, rank=0)
    # An ended instance frees the slot for its replacement.
    first = Instance.objects.get(job=job, rank=0)
    transition_instance(first.pk, InstanceState.REQUESTED, InstanceState.ENDED, end_reason=EndReason.CAPACITY_ERROR)
    make_instance(job, rank=0)
    assert Instance.objects.filter(job=job, rank=0, state__in=InstanceState.LIVE).count() == 1
