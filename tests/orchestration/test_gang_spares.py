"""Spares for a gang (issue 20 item 1, docs/spares.md "Gangs"), in the control plane's
own code on the local provider's price book: a notice to one node of a 2-node gang
launches a spare for every node, in one placement with a rendezvous of their own; the
gang trains on until every spare is ready, then saves and stops together; the spares are
promoted together once every old node has ended, counting one preemption; and a gang
hands over whole or not at all."""

import datetime as dt
import uuid
from pathlib import Path

import pytest
from django.db import transaction
from django.utils import timezone

from respawn.protocol import Action
from respawn_server.jobs.core import services
from respawn_server.jobs.core.choices import EndReason, InstanceState, JobStatus
from respawn_server.jobs.fleet import orchestration
from respawn_server.jobs.models import Instance, Job
from tests.factories import make_instance, make_job, make_team_with_members

NODES = 2


@pytest.fixture
def gang(settings, db):
    """A running 2-node job whose rank 1 (in local-a) just got a notice with a 120 s
    deadline; rank 0 got none."""
    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": ["local"]}
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, allowed_clouds=["local"], nodes=NODES,
                   status=JobStatus.RUNNING)
    nodes = [make_instance(job, rank=rank, state=InstanceState.RUNNING, zone="local-a",
                           rendezvous_addr="127.0.0.1:29400").instance for rank in range(NODES)]
    now = timezone.now()
    with transaction.atomic():
        services.record_notice(nodes[1], source="local", notice_time=now, deadline=now + dt.timedelta(seconds=120),
                               raw="")
    for node in nodes:
        node.refresh_from_db()
    return job, nodes


def launched(nodes) -> list[Instance]:
    return list(Instance.objects.filter(pk__in=orchestration.launch_spare(nodes[1].pk)).order_by("rank"))


def register(spare: Instance) -> None:
    with transaction.atomic():
        services.register_instance(spare, hostname=f"spare-{spare.rank}", agent_version="t", provider_instance_id="")


def actions(nodes) -> list[str]:
    return [Instance.objects.get(pk=node.pk).requested_action for node in nodes]


def notice_save(rank0: Instance, capture):
    with capture(execute=True), transaction.atomic():
        save, _ = services.record_checkpoint(rank0, checkpoint_id=uuid.uuid4(), step=90, uri="/c/90", bytes=1,
                                             manifest_digest="d", kind="notice", committed_at=timezone.now())
    return save


def test_a_notice_to_one_node_launches_a_spare_for_every_node_in_one_placement_and_the_gang_trains_on(gang):
    job, nodes = gang
    spares = launched(nodes)
    assert [(s.rank, s.standby_for_id, s.world_size) for s in spares] == [(n.rank, n.pk, NODES) for n in nodes]
    assert len({(s.zone, s.instance_type) for s in spares}) == 1 and spares[0].zone != "local-a"
    # A rendezvous of their own: the new gang never meets the old one.
    assert spares[0].rendezvous_addr and spares[0].rendezvous_addr == spares[1].rendezvous_addr != "127.0.0.1:29400"
    # Below the ephemeral range: no heartbeat's connection can take the port before rank 0 binds it.
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert int(spares[0].rendezvous_addr.rsplit(":", 1)[1]) < ephemeral_low
    # The noticed node trains on while they boot; its peer, told nothing, trains on too.
    assert actions(nodes) == ["", Action.HOLD]
    assert job.events.filter(message__contains=f"spare instances {spares[0].pk}, {spares[1].pk} launching").exists()
    assert orchestration.launch_spare(nodes[0].pk) == []  # a second notice in the gang adds none


def test_the_gang_is_told_to_save_and_stop_only_once_every_spare_is_ready(gang):
    job, nodes = gang
    spares = launched(nodes)
    services.spare_ready(spares[1])
    assert actions(nodes) == ["", Action.HOLD]  # a spare still boots: train on
    services.spare_ready(spares[0])
    assert actions(nodes) == [Action.CHECKPOINT_AND_STOP] * NODES  # the whole gang, together


def test_rank_0_s_notice_commit_hands_the_whole_gang_over_counting_one_preemption(
        gang, django_capture_on_commit_callbacks):
    job, nodes = gang
    spares = launched(nodes)
    for spare in spares:
        register(spare)
    save = notice_save(nodes[0], django_capture_on_commit_callbacks)
    # The noticed node ends with the commit; rank 0, which made it, ends on its agent's exit report.
    assert Instance.objects.get(pk=nodes[1].pk).end_reason == EndReason.PREEMPTED
    assert all(Instance.objects.get(pk=s.pk).standby_for_id is not None for s in spares)
    with transaction.atomic():
        services.record_exit(nodes[0], reason="stopped", exit_code=0, final_step=90, output_tail="",
                             last_exception="", artifact_uri="", artifact_digest="")
    nodes = [Instance.objects.get(pk=n.pk) for n in nodes]
    spares = [Instance.objects.get(pk=s.pk) for s in spares]
    assert [(n.state, n.end_reason) for n in nodes] == [(InstanceState.ENDED, EndReason.FENCED),
                                                       (InstanceState.ENDED, EndReason.PREEMPTED)]
    assert [(s.standby_for_id, s.resume_checkpoint_id) for s in spares] == [(None, save.pk)] * NODES
    job.refresh_from_db()
    assert (job.status, job.preemptions) == (JobStatus.RUNNING, 1)
    assert all(job.events.filter(message__contains=f"spare instance {s.pk} promoted").filter(
        message__contains="the price of the overlap").exists() for s in spares)


def test_a_spares_ready_call_read_before_its_promotion_leaves_the_new_gang_training(
        gang, django_capture_on_commit_callbacks):
    # Seen end to end under load (a drilled gang): a spare's standby poll read its row while
    # it stood by; the gang was handed over and it promoted before the poll said it was
    # ready, and the stale "ready" told the new gang, the spares themselves, to save and stop.
    job, nodes = gang
    spares = launched(nodes)
    for spare in spares:
        register(spare)
    stale = Instance.objects.get(pk=spares[0].pk)  # what the poll read
    notice_save(nodes[0], django_capture_on_commit_callbacks)
    with transaction.atomic():
        services.record_exit(nodes[0], reason="stopped", exit_code=0, final_step=90, output_tail="",
                             last_exception="", artifact_uri="", artifact_digest="")
    assert Instance.objects.get(pk=spares[0].pk).standby_for_id is None  # promoted
    services.spare_ready(stale)
    assert actions(spares) == ["", ""]


def test_no_spare_trains_before_every_old_node_has_ended(gang):
    job, nodes = gang
    spares = launched(nodes)
    for spare in spares:
        register(spare)
    with transaction.atomic():  # the noticed node's VM is gone before the gang could save
        services.record_exit(nodes[1], reason="preempted", exit_code=0, final_step=80, output_tail="",
                             last_exception="", artifact_uri="", artifact_digest="")
    assert all(Instance.objects.get(pk=s.pk).standby_for_id is not None for s in spares)
    assert Job.objects.get(pk=job.pk).status == JobStatus.RUNNING
    assert actions(nodes)[0] == Action.CHECKPOINT_AND_STOP  # its peer stops: no collective without it
    with transaction.atomic():
        services.record_exit(nodes[0], reason="stopped", exit_code=0, final_step=80, output_tail="",
                             last_exception="", artifact_uri="", artifact_digest="")
    assert all(Instance.objects.get(pk=s.pk).standby_for_id is None for s in spares)
    job.refresh_from_db()
    assert (job.status, job.preemptions) == (JobStatus.RUNNING, 1)


def test_a_spare_lost_before_promotion_releases_the_rest_and_the_gang_saves_now(gang):
    job, nodes = gang
    spares = launched(nodes)
    Instance.objects.filter(pk=spares[0].pk).update(requested_at=timezone.now() - dt.timedelta(hours=1))
    orchestration.retry_stuck_provisioning()  # rank 0's spare never registered
    spares = [Instance.objects.get(pk=s.pk) for s in spares]
    assert [(s.state, s.end_reason) for s in spares] == [(InstanceState.ENDED, EndReason.CAPACITY_ERROR),
                                                        (InstanceState.ENDED, EndReason.FENCED)]
    assert job.events.filter(message__contains=f"spare instance {spares[1].pk} released").exists()
    assert actions(nodes) == [Action.CHECKPOINT_AND_STOP] * NODES  # none is coming: the gang saves now
    # The gang then relaunches as it would have without spares.
    for node, reason in zip(nodes, ("stopped", "preempted")):
        with transaction.atomic():
            services.record_exit(node, reason=reason, exit_code=0, final_step=80, output_tail="", last_exception="",
                                 artifact_uri="", artifact_digest="")
    job.refresh_from_db()
    assert (job.status, job.preemptions) == (JobStatus.RECOVERING, 1)


def test_a_false_notice_releases_every_spare_of_the_gang(gang):
    job, nodes = gang
    spares = launched(nodes)
    nodes[1].interruptions.update(deadline=timezone.now() - dt.timedelta(hours=1))  # the VM outlived it
    assert orchestration.release_stale_spares() == NODES
    assert all(Instance.objects.get(pk=s.pk).end_reason == EndReason.FENCED for s in spares)
    assert all(Instance.objects.get(pk=n.pk).state in InstanceState.LIVE for n in nodes)  # they keep their slots
