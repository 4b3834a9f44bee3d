"""The hand-over of a noticed VM's state to its spare's store (docs/memory-tier.md,
jobs/recovery/handover.py), through the agent API: who may say where a store listens,
what a malformed address gets, and what each VM is told, the store's token reaching
each only in its own answer."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import transaction
from django.utils import timezone

from respawn import protocol
from respawn_server.jobs.core.choices import InstanceState, JobStatus
from respawn_server.jobs.models import Instance, InterruptionEvent
from respawn_server.jobs.money import costs
from respawn_server.jobs.money.downtime import job_downtime
from respawn_server.jobs.people.tokens import BOOTSTRAP_PREFIX, new_token
from respawn_server.jobs.recovery.spares import launch_spare
from respawn_server.jobs.reports.notices import record_notice
from tests.factories import make_instance, make_job, make_team_with_members

from .helpers import AgentClient

pytestmark = pytest.mark.django_db


def noticed_with_a_spare(settings, env: dict) -> tuple[AgentClient, AgentClient, Instance, dict]:
    """A one-node job (its env `env`) whose VM got a notice and whose spare has registered:
    the old VM's and the spare's agent clients, the old instance, the spare's job spec."""
    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": ["local"]}
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, allowed_clouds=["local"], status=JobStatus.RUNNING, env=env)
    old = make_instance(job, state=InstanceState.RUNNING, registered=True)
    now = timezone.now()
    with transaction.atomic():
        record_notice(old.instance, source="local", notice_time=now, deadline=now + dt.timedelta(seconds=120), raw="")
    [spare_id] = launch_spare(old.instance.pk)
    # The launched spare's bootstrap token went to its VM: give it one this test knows.
    bootstrap, digest = new_token(BOOTSTRAP_PREFIX)
    Instance.objects.filter(pk=spare_id).update(bootstrap_token_hash=digest)
    spare_agent = AgentClient()
    registered = spare_agent.register(bootstrap)
    assert registered.status_code == 200, registered.json()
    return AgentClient(old.agent_token), spare_agent, old.instance, registered.json()["job"]


def test_a_spare_of_a_job_with_the_tier_says_where_its_store_is_and_its_noticed_vm_is_told_with_the_token(settings):
    old_agent, spare_agent, old, spec = noticed_with_a_spare(settings, {"RESPAWN_MEMORY_TIER": "on"})
    assert spec["standby"] is True and len(spec["handover_token"]) == 64
    answer = spare_agent.post(protocol.PATH_HANDOVER, protocol.Handover(address="10.0.0.9:41234"))
    assert answer.status_code == 200, answer.json()
    # Ready (its standby poll): the noticed VM is told to save and stop, and where the save goes.
    assert spare_agent.client.get(protocol.API_PREFIX + protocol.PATH_STANDBY).json()["standby"] is True
    beat = old_agent.post(protocol.PATH_HEARTBEAT, protocol.Heartbeat(step=40)).json()
    assert beat["action"] == protocol.Action.CHECKPOINT_AND_STOP
    assert beat["handover"] == {"address": "10.0.0.9:41234", "token": spec["handover_token"], "node": old.rank}


def test_without_the_tier_a_spare_gets_no_token_may_not_hand_over_and_the_noticed_vm_hears_of_none(settings):
    old_agent, spare_agent, _, spec = noticed_with_a_spare(settings, {})
    assert spec["handover_token"] == ""
    refused = spare_agent.post(protocol.PATH_HANDOVER, protocol.Handover(address="10.0.0.9:41234"))
    assert refused.status_code == 403 and "RESPAWN_MEMORY_TIER=on" in refused.json()["detail"]
    spare_agent.client.get(protocol.API_PREFIX + protocol.PATH_STANDBY)
    beat = old_agent.post(protocol.PATH_HEARTBEAT, protocol.Heartbeat(step=40)).json()
    assert beat["action"] == protocol.Action.CHECKPOINT_AND_STOP and beat["handover"] is None


def test_only_a_spare_hands_over_and_a_malformed_address_is_refused_naming_the_field(settings):
    old_agent, spare_agent, _, _ = noticed_with_a_spare(settings, {"RESPAWN_MEMORY_TIER": "on"})
    refused = old_agent.post(protocol.PATH_HANDOVER, protocol.Handover(address="10.0.0.9:41234"))
    assert refused.status_code == 403  # the noticed VM itself is no spare
    for address in ("10.0.0.9", "10.0.0.9:0", "10.0.0.9:70000", "http://10.0.0.9:1", "a b:1", ""):
        bad = spare_agent.post(protocol.PATH_HANDOVER, protocol.Handover(address=address))
        assert bad.status_code == 400 and "address" in bad.json()["errors"], (address, bad.json())


def test_a_spare_that_resumed_from_its_store_past_storages_checkpoint_keeps_the_noticed_vms_work_to_that_step(settings):
    """Storage's write of the notice save missed the window; the spare resumed the notice
    step from its store. Its heartbeat says so: believed between the checkpoint its
    promotion named and the furthest step the noticed VM was seen to reach, the money
    counts the noticed VM's work kept to that step and the page says where the job went
    on from; a claim past what the control plane saw is logged and counts for nothing."""
    from tests.downtime.test_downtime import _checkpoint

    old_agent, spare_agent, old, _ = noticed_with_a_spare(settings, {"RESPAWN_MEMORY_TIER": "on"})
    assert spare_agent.post(protocol.PATH_HANDOVER, protocol.Handover(address="10.0.0.9:41234")).status_code == 200
    assert old_agent.post(protocol.PATH_HEARTBEAT, protocol.Heartbeat(step=60)).status_code == 200
    periodic = _checkpoint(old, 40, "periodic", timezone.now())
    # The notice save of step 60 never committed; the old VM ended, the spare took over from step 40.
    spare = Instance.objects.get(standby_for=old)
    began = timezone.now() - dt.timedelta(minutes=10)
    Instance.objects.filter(pk=old.pk).update(state=InstanceState.ENDED, end_reason="preempted", ended_at=timezone.now(),
                                              registered_at=began, running_at=began)
    Instance.objects.filter(pk=spare.pk).update(standby_for=None, resume_checkpoint=periodic, last_step=40)
    # As its exit report recorded it: no checkpoint in the window, 20 steps past storage's.
    InterruptionEvent.objects.filter(instance=old, kind="notice").update(checkpoint_saved=False, steps_lost=20)

    beat = spare_agent.post(protocol.PATH_HEARTBEAT, protocol.Heartbeat(step=61, memory_resume_step=70))
    assert beat.status_code == 200 and Instance.objects.get(pk=spare.pk).memory_resume_step is None  # past 60: not believed
    assert old.job.events.filter(message__contains="resumed at step 70 from the memory tier, not between").exists()
    assert costs.job_cost(old.job).work[old.pk].steps_kept == 40
    assert InterruptionEvent.objects.get(instance=old, kind="notice").steps_lost == 20

    spare_agent.post(protocol.PATH_HEARTBEAT, protocol.Heartbeat(step=62, memory_resume_step=60))
    assert Instance.objects.get(pk=spare.pk).memory_resume_step == 60
    assert old.job.events.filter(message__contains=f"spare instance {spare.pk} resumed at step 60 from the memory tier "
                                                   f"(instance {old.pk}'s notice save, handed over), 20 step(s) newer "
                                                   f"than the checkpoint in storage (step 40); instance {old.pk}'s "
                                                   "interruption now counts 0 step(s) lost, not the 20 said when it "
                                                   "ended: the rest are kept, not trained again").exists()
    assert costs.job_cost(old.job).work[old.pk].steps_kept == 60  # not 40: the state of step 60 went on
    assert InterruptionEvent.objects.get(instance=old, kind="notice").steps_lost == 0  # the memory tier kept them
    _, [interruption] = job_downtime(old.job_id, timezone.now())
    assert (interruption.resume_step, interruption.resume_tier) == (60, "memory")
