"""An elastic gang grows back (issue 20 item 2, docs/elastic.md), in the control plane's
own code on PostgreSQL and the local provider: a 3-node job (nodes_min 2) that lost a
node trains on 2; GROW_RETRY_S later a joiner is launched beside its rank 0; ready, it
has the gang asked for a checkpoint, and at that checkpoint's commit the gang regroups
with it at 3. A joiner refused, or a node lost first, leaves the gang at its size."""

import datetime as dt
import uuid

import pytest
from django.db import transaction
from django.utils import timezone
from rest_framework.test import APIClient

from respawn.protocol import Action
from respawn_server.jobs.core.choices import EndReason, InstanceState, JobStatus
from respawn_server.jobs.fleet.launcher import _capacity_error
from respawn_server.jobs.fleet.providers.base import Placement
from respawn_server.jobs.models import Instance, Job
from respawn_server.jobs.people.tokens import AGENT_PREFIX, new_token
from respawn_server.jobs.recovery.gangs import current_world_size
from respawn_server.jobs.recovery.joiners import grow_elastic_gangs, grow_with_joiners
from respawn_server.jobs.reports.checkpoints import record_checkpoint
from respawn_server.jobs.reports.exits import record_exit
from respawn_server.jobs.reports.registration import register_instance
from tests.factories import make_job, make_team_with_members
from tests.orchestration.test_elastic_gangs import elastic, gone, rows  # noqa: F401  (elastic: a fixture)

RETRY_S = 60


@pytest.fixture
def shrunk(elastic, settings):  # noqa: F811
    """The elastic job after rank 1's VM was lost: 2 nodes, generation 1, shrunk long
    enough ago that it may try to grow."""
    settings.RESPAWN = {**settings.RESPAWN, "GROW_RETRY_S": RETRY_S}
    job, nodes = elastic
    Instance.objects.filter(job=job).update(registered_at=timezone.now() - dt.timedelta(minutes=10))
    gone(nodes[1].instance)
    job.world_sizes.update(at=timezone.now() - dt.timedelta(seconds=RETRY_S + 1))
    return job, [Instance.objects.get(pk=nodes[i].instance.pk) for i in (0, 2)], nodes[0].agent_token


def launch_joiners(job) -> list[Instance]:
    with transaction.atomic():
        grow_elastic_gangs()
    return list(Instance.objects.filter(job=job, joining=True, state__in=InstanceState.LIVE).order_by("rank"))


def registered(joiner: Instance) -> APIClient:
    """The joiner's agent, registered, as an API client with its token."""
    with transaction.atomic():
        register_instance(joiner, hostname="joiner", agent_version="t", provider_instance_id="local-j")
    token, digest = new_token(AGENT_PREFIX)
    Instance.objects.filter(pk=joiner.pk).update(agent_token_hash=digest)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def commit(rank0: Instance, step: int, capture) -> None:
    with capture(execute=True), transaction.atomic():
        record_checkpoint(rank0, checkpoint_id=uuid.uuid4(), step=step, uri=f"/c/{step}", bytes=1,
                          manifest_digest="d", kind="periodic", committed_at=timezone.now())


def test_a_shrunk_gang_grows_back_with_a_joiner_at_the_checkpoint_it_asks_for(shrunk, django_capture_on_commit_callbacks):
    job, (rank0, rank1), _ = shrunk
    [joiner] = launch_joiners(job)
    # Beside rank 0 (its nodes talk every step), in the slot above the gang's, training nothing yet.
    assert (joiner.rank, joiner.zone, joiner.instance_type, joiner.rendezvous_addr) == \
        (2, rank0.zone, rank0.instance_type, rank0.rendezvous_addr)
    assert job.events.filter(message__contains=f"joiner instance {joiner.pk} launching").exists()
    assert launch_joiners(job) == [joiner]  # growing already: no second one
    assert current_world_size(job) == 2

    agent = registered(joiner)
    assert Instance.objects.get(pk=joiner.pk).resume_checkpoint is None  # fixed when the gang takes it in
    waiting = agent.get("/api/agent/v1/standby").json()
    assert waiting["standby"] is True
    # Its asking says it is ready: the gang's rank 0 is asked for a checkpoint, once.
    assert [Instance.objects.get(pk=n.pk).requested_action for n in (rank0, rank1)] == [Action.CHECKPOINT, ""]
    agent.get("/api/agent/v1/standby")
    assert job.events.filter(message__contains="ready: the gang is asked for a checkpoint").count() == 1

    commit(Instance.objects.get(pk=rank0.pk), 70, django_capture_on_commit_callbacks)

    assert rows(job) == [(rank0.pk, 0, 3, 2), (rank1.pk, 1, 3, 2), (joiner.pk, 2, 3, 2)]
    grown = list(Instance.objects.filter(job=job, state__in=InstanceState.LIVE).select_related("resume_checkpoint"))
    assert {n.resume_checkpoint.step for n in grown} == {70} and len({n.rendezvous_addr for n in grown}) == 1
    assert not any(n.joining for n in grown) and {n.requested_action for n in grown} == {""}
    assert Instance.objects.get(pk=joiner.pk).earlier_runs == []  # it had no run before
    assert [len(Instance.objects.get(pk=n.pk).earlier_runs) for n in (rank0, rank1)] == [2, 2]
    assert list(job.world_sizes.order_by("at", "id").values_list("world_size", flat=True)) == [3, 2, 3]
    assert job.events.filter(message__contains="capacity is back: the gang grows from 2 to 3 of 3 nodes, "
                                               "from step 70").exists()
    answer = agent.get("/api/agent/v1/standby").json()
    assert answer == {"standby": False, "resume_from": "/c/70", "resume_step": 70, "resume_validation": "skipped",
                      "rank": 2, "world_size": 3, "rendezvous_addr": grown[0].rendezvous_addr, "gang_generation": 2}
    job.refresh_from_db()
    assert (job.status, job.preemptions) == (JobStatus.RUNNING, 1)  # growing is no interruption
    assert launch_joiners(job) == []  # full again


def test_a_gang_tries_to_grow_only_retry_seconds_after_it_shrank_or_last_tried(shrunk):
    job, _, _ = shrunk
    job.world_sizes.update(at=timezone.now())
    assert launch_joiners(job) == []
    job.world_sizes.update(at=timezone.now() - dt.timedelta(seconds=RETRY_S + 1))
    [joiner] = launch_joiners(job)
    with transaction.atomic():  # the cloud has no capacity for it
        _capacity_error(Instance.objects.select_related("job").get(pk=joiner.pk),
                        Placement(provider="local", region="local", zone=joiner.zone,
                                                instance_type=joiner.instance_type), "InsufficientInstanceCapacity")
    assert Instance.objects.get(pk=joiner.pk).end_reason == EndReason.CAPACITY_ERROR
    assert rows(job)[0][1:] == (0, 2, 1)  # the gang trains on, untouched
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    assert job.events.filter(message__contains=f"tries to grow again in {RETRY_S}s").exists()
    assert launch_joiners(job) == []  # not before RETRY_S after that try
    Instance.objects.filter(pk=joiner.pk).update(requested_at=timezone.now() - dt.timedelta(seconds=RETRY_S + 1))
    assert len(launch_joiners(job)) == 1


def test_a_node_lost_while_a_joiner_boots_releases_it_and_the_gang_goes_on_smaller(shrunk):
    job, (rank0, rank1), _ = shrunk
    Job.objects.filter(pk=job.pk).update(nodes_min=1)
    [joiner] = launch_joiners(job)
    gone(Instance.objects.get(pk=rank1.pk))
    assert Instance.objects.get(pk=joiner.pk).end_reason == EndReason.FENCED
    assert rows(job) == [(rank0.pk, 0, 1, 2)]
    assert job.events.filter(message__contains="1 joiner(s) released").exists()


def test_a_joiner_never_holds_up_the_job_finishing_or_counts_as_a_node(shrunk):
    job, (rank0, rank1), _ = shrunk
    [joiner] = launch_joiners(job)
    registered(joiner)
    for node in (rank0, rank1):
        with transaction.atomic():
            record_exit(Instance.objects.select_related("job").get(pk=node.pk), reason="completed",
                        exit_code=0, final_step=100, output_tail="", last_exception="", artifact_uri="",
                        artifact_digest="")
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, list(job.events.values_list("message", flat=True))
    assert Instance.objects.get(pk=joiner.pk).end_reason == EndReason.FENCED


@pytest.mark.parametrize("before_loss", [130, 180])
def test_the_money_counts_the_joiners_run_from_the_growth_checkpoint_and_the_survivors_redone_steps(
        db, settings, before_loss):
    """3 nodes to step `before_loss` (checkpoint 100); rank 1 lost; ranks 0 and 2 (now 1) go
    on from 100 to 200 (checkpoint 180); a joiner makes 3 again from 180; all end at 300.
    Kept, node by node: the survivors 100 + 80 + 120, the lost node 100, the joiner 120:
    820 node-steps, the work the three phases did (3×100 + 2×80 + 3×120). Redone: each
    survivor's steps past 100 and 20 past 180; the joiner none. At 180 the joiner resumes
    at the very step rank 2's first run had reached, which it still did not go on from
    (a real e2e run counted 3 steps twice that way)."""
    from respawn_server.jobs.money import costs
    from tests.costs.history import T, launched, seed_prices

    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": ["local"]}
    seed_prices()
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, nodes=3, nodes_min=2, status=JobStatus.RUNNING)
    nodes = [launched(job, at=T(3, 1, 2), last_step=before_loss, rank=rank) for rank in range(3)]
    with transaction.atomic():
        record_checkpoint(nodes[0], checkpoint_id=uuid.uuid4(), step=100, uri="/c/100", bytes=1,
                          manifest_digest="d", kind="periodic", committed_at=T(3, 1, 3))
    gone(nodes[1])
    Instance.objects.filter(pk__in=[nodes[0].pk, nodes[2].pk]).update(last_step=200)
    joiner = launched(job, at=T(3, 1, 4), rank=2, joining=True, standby_ready_at=T(3, 1, 4))
    with transaction.atomic():
        record_checkpoint(Instance.objects.get(pk=nodes[0].pk), checkpoint_id=uuid.uuid4(), step=180,
                          uri="/c/180", bytes=1, manifest_digest="d", kind="periodic", committed_at=T(3, 1, 5))
    assert grow_with_joiners(job.pk)
    Instance.objects.filter(job=job, state__in=InstanceState.LIVE).update(
        last_step=300, state=InstanceState.ENDED, end_reason=EndReason.COMPLETED, ended_at=T(3, 1, 7))

    work = costs.job_cost(job, T(3, 2)).work
    assert {pk: (w.steps_kept, w.recomputed_steps) for pk, w in work.items()} == {
        nodes[0].pk: (300, before_loss - 100 + 20), nodes[1].pk: (100, 0), nodes[2].pk: (300, before_loss - 100 + 20),
        joiner.pk: (120, 0)}
