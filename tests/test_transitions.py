"""Both state machines, every pair of states: allowed ones happen once and write
an event row; forbidden ones raise and change nothing.

The expected edges are DESIGN §4's tables, copied here as literals: read from the
code's own tables, a wrong edge there would pass its own test."""

import itertools

import pytest

from respawn_server.jobs.core.choices import EndReason, InstanceState, JobStatus
from respawn_server.jobs.core.transitions import IllegalTransition, transition_instance, transition_job
from respawn_server.jobs.models import Instance, InstanceEvent, Job, JobEvent
from tests.factories import make_instance, make_job, make_team_with_members

# DESIGN §4, job `status`: from -> to. The terminal states have no row: nothing leaves them.
DESIGN_JOB = {
    "queued": {"provisioning", "cancelled"},
    "provisioning": {"running", "queued", "recovering", "failed", "cancelling"},
    "running": {"succeeded", "finishing", "recovering", "failed", "cancelling"},
    "recovering": {"provisioning", "failed", "cancelling"},
    "finishing": {"succeeded", "failed", "cancelling"},
    "cancelling": {"cancelled"},
    "succeeded": set(),
    "failed": set(),
    "cancelled": set(),
}

# DESIGN §4, instance `state`: from -> to; `ended` is final.
DESIGN_INSTANCE = {
    "requested": {"booting", "ended"},
    "booting": {"running", "ended"},
    "running": {"preempting", "ended"},
    "preempting": {"ended"},
    "ended": set(),
}

JOB_PAIRS = list(itertools.product(DESIGN_JOB, repeat=2))
INSTANCE_PAIRS = list(itertools.product(DESIGN_INSTANCE, repeat=2))


@pytest.mark.parametrize("design,code", [(DESIGN_JOB, JobStatus), (DESIGN_INSTANCE, InstanceState)],
                         ids=["job", "instance"])
def test_the_codes_table_is_designs(design, code):
    """Both ways: every edge DESIGN allows is in the code's table, and no other edge is."""
    assert set(code.ALL) == set(design)
    assert {state: set(targets) for state, targets in code.TRANSITIONS.items()} == design


@pytest.fixture
def job(db):
    setup = make_team_with_members()
    return make_job(setup.team, setup.people["member"].user)


@pytest.mark.parametrize("old,new", JOB_PAIRS, ids=[f"{a}->{b}" for a, b in JOB_PAIRS])
def test_job_transition_follows_the_table(job, old, new):
    Job.objects.filter(pk=job.pk).update(status=old)
    if new in DESIGN_JOB[old]:
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
    if new in DESIGN_INSTANCE[old]:
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
