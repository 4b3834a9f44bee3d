"""Elastic gangs (issue 20 item 2, docs/elastic.md) in the control plane's own code, on
PostgreSQL and the local provider: a 3-node job that trains on 2..3 nodes. A node lost
leaves the survivors training on, re-ranked, from the newest checkpoint, in a new
generation their heartbeats carry; too few left, the gang is relaunched whole as before;
a node never placed at the start leaves the gang starting with the rest; the job's world
sizes are its history."""

import datetime as dt
import uuid

import pytest
from django.db import transaction
from django.utils import timezone
from rest_framework.test import APIClient

from respawn.protocol import Action
from respawn_server.jobs.core.choices import EndReason, InstanceState, JobStatus
from respawn_server.jobs.fleet.reconciler import _end_gone, check_elastic_gang, retry_stuck_provisioning
from respawn_server.jobs.models import Checkpoint, Instance, InterruptionEvent, Job, WorldSize
from respawn_server.jobs.recovery.elastic import trainer_exited
from respawn_server.jobs.reports.checkpoints import record_checkpoint
from respawn_server.jobs.reports.exits import record_exit
from tests.factories import make_instance, make_job, make_team_with_members

NODES = 3


@pytest.fixture
def elastic(settings, db):
    """A running 3-node elastic job (nodes_min 2), each node registered on a local VM id
    the local provider has never heard of (so `describe` says gone), with a committed
    checkpoint at step 40."""
    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": ["local"]}
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, allowed_clouds=["local"], nodes=NODES, nodes_min=2,
                   status=JobStatus.RUNNING)
    WorldSize.objects.create(job=job, world_size=NODES, reason="3 node(s) placed")
    nodes = [make_instance(job, rank=rank, state=InstanceState.RUNNING, registered=True, hostname=f"node-{rank}",
                           rendezvous_addr="127.0.0.1:29400", last_step=55) for rank in range(NODES)]
    with transaction.atomic():
        record_checkpoint(nodes[0].instance, checkpoint_id=uuid.uuid4(), step=40, uri="/c/40", bytes=1,
                          manifest_digest="d", kind="periodic", committed_at=timezone.now())
    return job, nodes


def gone(instance: Instance) -> None:
    """What the reconciler (or check_elastic_gang) does when the cloud says a VM is gone."""
    _end_gone(instance, "heartbeat deadline passed; the cloud says gone")


def rows(job) -> list[tuple]:
    return list(Instance.objects.filter(job=job, state__in=InstanceState.LIVE).order_by("rank").values_list(
        "pk", "rank", "world_size", "gang_generation"))


def test_a_node_lost_leaves_the_survivors_training_re_ranked_from_the_newest_checkpoint(elastic):
    job, nodes = elastic
    survivors = [nodes[0].instance.pk, nodes[2].instance.pk]
    gone(nodes[1].instance)

    assert rows(job) == [(survivors[0], 0, 2, 1), (survivors[1], 1, 2, 1)]  # rank 2 moved down to the free slot
    live = list(Instance.objects.filter(pk__in=survivors).select_related("resume_checkpoint"))
    assert {i.resume_checkpoint.step for i in live} == {40} and {i.last_step for i in live} == {40}
    assert len({i.rendezvous_addr for i in live}) == 1 and live[0].rendezvous_addr != "127.0.0.1:29400"
    assert {i.requested_action for i in live} == {""}  # not told to stop: they go on
    job.refresh_from_db()
    assert (job.status, job.preemptions) == (JobStatus.RUNNING, 1)
    assert Instance.objects.filter(job=job).count() == NODES  # no VM launched
    assert list(job.world_sizes.values_list("world_size", flat=True)) == [3, 2]
    assert job.events.filter(message__contains="the gang goes on with 2 of 3 nodes, from step 40").exists()


def test_the_heartbeat_answer_names_the_new_generation_and_standby_says_where_the_node_trains_now(elastic):
    job, nodes = elastic
    gone(nodes[1].instance)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {nodes[2].agent_token}")
    beat = client.post("/api/agent/v1/heartbeat", {"event_id": str(uuid.uuid4()), "step": 55}, format="json")
    assert beat.status_code == 200 and beat.json()["gang_generation"] == 1
    where = client.get("/api/agent/v1/standby").json()
    survivor = Instance.objects.get(pk=nodes[2].instance.pk)
    assert where == {"standby": False, "resume_from": "/c/40", "resume_step": 40, "resume_validation": "skipped",
                     "rank": 1, "world_size": 2, "rendezvous_addr": survivor.rendezvous_addr, "gang_generation": 1}


def test_with_fewer_than_nodes_min_left_the_gang_is_relaunched_whole(elastic):
    job, nodes = elastic
    gone(nodes[1].instance)
    gone(Instance.objects.get(pk=nodes[2].instance.pk))  # now rank 1 of the regrouped pair

    job.refresh_from_db()
    assert job.status == JobStatus.RECOVERING and job.preemptions == 2
    assert Instance.objects.get(pk=nodes[0].instance.pk).requested_action == Action.STOP
    assert job.events.filter(message__contains="fewer than the 2 the job trains on at least").exists()


def test_a_gang_that_is_not_elastic_is_relaunched_whole_as_before(elastic):
    job, nodes = elastic
    Job.objects.filter(pk=job.pk).update(nodes_min=None)
    gone(nodes[1].instance)
    job.refresh_from_db()
    assert job.status == JobStatus.RECOVERING
    assert rows(job)[0][1:] == (0, NODES, 0)


def test_a_trainer_exit_is_checked_once_per_generation_and_only_for_an_elastic_gang(elastic,
                                                                                   django_capture_on_commit_callbacks):
    job, nodes = elastic
    Instance.objects.filter(pk=nodes[1].instance.pk).update(provider_instance_id="local-901-0000bbbb")  # never ran
    survivor = nodes[0].instance
    with django_capture_on_commit_callbacks() as sent, transaction.atomic():
        trainer_exited(survivor, exit_code=1, generation=0)
        trainer_exited(survivor, exit_code=1, generation=0)  # a resent heartbeat
    assert len(sent) == 1 and Instance.objects.get(pk=survivor.pk).trainer_exited_at is not None

    check_elastic_gang(job.pk)  # what the nudge runs: rank 1's VM is gone to the local provider
    assert Instance.objects.get(pk=nodes[1].instance.pk).end_reason == EndReason.PREEMPTED
    assert rows(job) == [(survivor.pk, 0, 2, 1), (nodes[2].instance.pk, 1, 2, 1)]
    assert not Instance.objects.filter(job=job, trainer_exited_at__isnull=False).exists()

    # A word about the old generation, from a node that has not yet seen the regroup, is none.
    late = Instance.objects.get(pk=nodes[2].instance.pk)
    with django_capture_on_commit_callbacks() as stale, transaction.atomic():
        trainer_exited(late, exit_code=1, generation=0)
    assert stale == [] and Instance.objects.get(pk=late.pk).trainer_exited_at is None

    Job.objects.filter(pk=job.pk).update(nodes_min=None)  # nor is one from a gang that is not elastic
    with django_capture_on_commit_callbacks() as ignored, transaction.atomic():
        trainer_exited(late, exit_code=1, generation=1)
    assert ignored == [] and Instance.objects.get(pk=late.pk).trainer_exited_at is None


def test_a_heartbeat_saying_the_trainer_exited_marks_the_node_waiting(elastic):
    job, nodes = elastic
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {nodes[1].agent_token}")
    beat = client.post("/api/agent/v1/heartbeat", {"event_id": str(uuid.uuid4()), "step": 55, "trainer_exit_code": -6,
                                                   "gang_generation": 0}, format="json")
    assert beat.status_code == 200, beat.content
    assert Instance.objects.get(pk=nodes[1].instance.pk).trainer_exited_at is not None
    assert job.events.filter(message__contains="its trainer exited (code -6)").exists()
    bad = client.post("/api/agent/v1/heartbeat", {"event_id": str(uuid.uuid4()), "step": 55,
                                                  "trainer_exit_code": "x"}, format="json")
    assert bad.status_code == 400 and list(bad.json()["errors"]) == ["trainer_exit_code"]


def test_a_trainer_exit_with_every_peer_still_there_is_the_codes_and_stops_the_gang(elastic):
    job, nodes = elastic  # no node has a VM id: nothing the cloud could call gone
    trainer_exited(nodes[0].instance, exit_code=1, generation=0)
    check_elastic_gang(job.pk)
    assert set(Instance.objects.filter(job=job).values_list("requested_action", flat=True)) == {Action.STOP}
    assert rows(job) == [(n.instance.pk, n.instance.rank, NODES, 0) for n in nodes]
    assert not job.events.filter(message__contains="failed before a step").exists()  # at its full size


def test_a_regrouped_gang_whose_trainers_fail_before_a_step_is_told_why_on_its_events(elastic):
    # A trainer that cannot resume on the smaller size (a global batch 2 does not divide)
    # fails at its start on every node, their VMs all there.
    job, nodes = elastic
    gone(nodes[1].instance)
    survivor = Instance.objects.get(pk=nodes[0].instance.pk)
    trainer_exited(survivor, exit_code=1, generation=1)
    check_elastic_gang(job.pk)
    assert set(Instance.objects.filter(job=job, state__in=InstanceState.LIVE).values_list(
        "requested_action", flat=True)) == {Action.STOP}
    assert job.events.filter(message__contains="failed before a step at its regrouped size of 2 nodes").exists()
    assert job.events.filter(message__contains="a restart relaunches all 3 nodes").exists()


def test_a_node_never_placed_in_time_leaves_the_gang_starting_with_the_rest(elastic):
    job, nodes = elastic
    Job.objects.filter(pk=job.pk).update(status=JobStatus.PROVISIONING)
    late = nodes[2].instance
    Instance.objects.filter(pk=late.pk).update(state=InstanceState.REQUESTED, agent_token_hash=None,
                                               requested_at=timezone.now() - dt.timedelta(hours=1))
    assert retry_stuck_provisioning() == 1

    job.refresh_from_db()
    assert Instance.objects.get(pk=late.pk).end_reason == EndReason.CAPACITY_ERROR
    assert rows(job) == [(nodes[0].instance.pk, 0, 2, 1), (nodes[1].instance.pk, 1, 2, 1)]
    assert (job.status, job.preemptions) == (JobStatus.RUNNING, 0)  # refused capacity is no preemption


def test_a_regrouped_gang_succeeds_when_its_nodes_complete(elastic):
    job, nodes = elastic
    gone(nodes[1].instance)
    for pk in (nodes[0].instance.pk, nodes[2].instance.pk):
        record_exit(Instance.objects.select_related("job").get(pk=pk), reason="completed", exit_code=0,
                    final_step=1000, output_tail="", last_exception="", artifact_uri="", artifact_digest="")
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED


def test_a_min_above_max_is_refused_naming_the_field(elastic):
    job, _ = elastic
    client = APIClient()
    client.force_authenticate(job.owner)
    answer = client.post("/api/v1/jobs/", {"team": job.team.name, "name": "x", "command": ["python", "t.py"],
                                           "nodes": 2, "nodes_min": 3}, format="json")
    assert answer.status_code == 400 and list(answer.json()["errors"]) == ["nodes_min"], answer.json()
    assert "above nodes 2" in answer.json()["errors"]["nodes_min"][0]
    detail = client.get(f"/api/v1/jobs/{job.pk}/").json()
    assert [w["world_size"] for w in detail["world_sizes"]] == [3] and detail["nodes_min"] == 2


@pytest.mark.parametrize("lost_heard_at, redone_in_its_slot", [(130, 30), (90, 0)])
def test_the_money_counts_the_work_each_run_kept_and_the_downtime_the_regroup(db, settings, lost_heard_at,
                                                                             redone_in_its_slot):
    """3 nodes to step 130 with a checkpoint at 100; rank 1 lost; ranks 0 and 2 (now 1)
    go on from 100 to 300. Kept: rank 0 and the old rank 2 each 100 + 200, the lost node
    the 100 the gang went on from (not its 30 past it), also when its last heartbeat said
    step 90 (the gang's checkpoint proves it made 100). Redone: 30 on rank 0; the old rank
    2's in its new slot, past the lost node's last step there. The downtime: nothing
    requested or booted; restore until a survivor's first step since."""
    from datetime import timedelta

    from respawn_server.jobs.models import StepPoint
    from respawn_server.jobs.money import costs, downtime
    from tests.costs.history import T, heartbeats, launched, seed_prices

    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": ["local"]}
    seed_prices()
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, nodes=NODES, nodes_min=2, status=JobStatus.RUNNING)
    nodes = [launched(job, at=T(3, 1, 2), last_step=130 if rank != 1 else lost_heard_at, rank=rank)
             for rank in range(NODES)]
    heartbeats(nodes[1], [(timezone.now() - timedelta(seconds=10), 130)])
    with transaction.atomic():
        ckpt, _ = record_checkpoint(nodes[0], checkpoint_id=uuid.uuid4(), step=100, uri="/c/100", bytes=1,
                                    manifest_digest="d", kind="periodic", committed_at=T(3, 1, 3))
    gone(nodes[1])
    regrouped = job.world_sizes.get(world_size=2)
    StepPoint.objects.create(job=job, instance=nodes[2], step=131, time=regrouped.at + timedelta(seconds=3))
    Instance.objects.filter(pk__in=[nodes[0].pk, nodes[2].pk]).update(
        last_step=300, state=InstanceState.ENDED, end_reason=EndReason.COMPLETED, ended_at=T(3, 1, 5))

    work = costs.job_cost(job, T(3, 2)).work
    assert {pk: (w.steps_kept, w.recomputed_steps) for pk, w in work.items()} == {
        nodes[0].pk: (300, 30), nodes[1].pk: (100, 0), nodes[2].pk: (300, redone_in_its_slot)}

    _, (lost,) = downtime.job_downtime(job.pk, timezone.now())
    assert lost.instance_id == nodes[1].pk and lost.replacement_id is None and lost.resumed is not None
    assert (lost.resume_step, lost.resume_tier) == (100, "storage")
    assert lost.parts["boot"] == 0 and 2.9 <= lost.parts["restore"] <= 3.1 and lost.parts["capacity"] >= 9


def test_the_job_page_plots_the_world_size_and_says_the_gang_is_elastic(elastic):
    from django.test import Client

    job, nodes = elastic
    gone(nodes[1].instance)
    browser = Client()
    browser.force_login(job.owner)
    page = browser.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="world-size-chart"' in page and "an elastic gang of 2 to 3" in page
    sizes = browser.get(f"/jobs/{job.pk}/status.json").json()["world_sizes"]
    assert [(s["world_size"], s["reason"]) for s in sizes] == [
        (3, "3 node(s) placed"), (2, f"instance {nodes[1].instance.pk} preempted: the gang goes on with 2 of 3 nodes")]
    assert [s["resumed"] for s in sizes] == ["", "step 40 (storage)"]
    single = make_job(job.team, job.owner, status=JobStatus.RUNNING)
    assert 'id="world-size-chart"' not in browser.get(f"/jobs/{single.pk}/").content.decode()


def test_a_regroup_before_any_checkpoint_says_the_gang_resumed_from_the_start(elastic):
    from django.test import Client

    job, nodes = elastic
    Checkpoint.objects.filter(job=job).delete()  # lost before the gang's first commit
    gone(nodes[1].instance)
    browser = Client()
    browser.force_login(job.owner)
    sizes = browser.get(f"/jobs/{job.pk}/status.json").json()["world_sizes"]
    assert [(s["world_size"], s["resumed"]) for s in sizes] == [(3, ""), (2, "the start")]


def memory_tier_regroup(settings, resumed_at: int | None, *, earlier_gang: bool = False):
    """The money test's gang (3 nodes to step 130, a checkpoint at 100, rank 1 lost, the
    others on to 300), its survivors saying they resumed at `resumed_at` from the memory
    tier (None: they said nothing, as a gang without the tier). `earlier_gang`: the job's
    gang before this one (relaunched whole) regrouped too, in the same generation number."""
    from respawn_server.jobs.recovery.elastic import resumed_from_memory
    from tests.costs.history import T, launched, seed_prices

    settings.RESPAWN = {**settings.RESPAWN, "PROVIDERS": ["local"]}
    seed_prices()
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, nodes=NODES, nodes_min=2, status=JobStatus.RUNNING)
    nodes = [launched(job, at=T(3, 1, 2), last_step=130, rank=rank) for rank in range(NODES)]
    with transaction.atomic():
        record_checkpoint(nodes[0], checkpoint_id=uuid.uuid4(), step=100, uri="/c/100", bytes=1,
                          manifest_digest="d", kind="periodic", committed_at=T(3, 1, 3))
    if earlier_gang:
        WorldSize.objects.create(job=job, at=T(3, 1, 1), world_size=2, reason="an earlier gang's regroup",
                                 after_instance=nodes[1], gang_generation=1)
    gone(nodes[1])
    if resumed_at is not None:
        for survivor in (nodes[0], nodes[2]):  # both say it; the first is recorded
            resumed_from_memory(Instance.objects.get(pk=survivor.pk), step=resumed_at, generation=1)
    Instance.objects.filter(pk__in=[nodes[0].pk, nodes[2].pk]).update(
        last_step=300, state=InstanceState.ENDED, end_reason=EndReason.COMPLETED, ended_at=T(3, 1, 5))
    return job, nodes


def test_a_gang_resumed_from_the_memory_tier_is_counted_to_the_step_it_went_on_from(db, settings):
    """As the money test above, but the survivors resumed at step 125 from the memory tier:
    the lost node kept 125 steps (its replica held them), not the checkpoint's 100; each
    survivor redid 5 (126..130), not 30; the interruption says where the work went on from."""
    from respawn_server.jobs.money import costs, downtime
    from tests.costs.history import T

    job, nodes = memory_tier_regroup(settings, 125)
    regrouped = job.world_sizes.get(world_size=2)
    assert (regrouped.resume_step, regrouped.resume_tier, regrouped.resume_checkpoint.step) == (125, "memory", 100)
    assert job.events.filter(message__contains="resumed at step 125 from the memory tier, 25 step(s) newer than "
                                               f"the checkpoint in storage (step 100); instance {nodes[1].pk}'s "
                                               "interruption now counts 5 step(s) lost, not the 30 said when it "
                                               "ended").count() == 1
    work = costs.job_cost(job, T(3, 2)).work
    assert {pk: (w.steps_kept, w.recomputed_steps) for pk, w in work.items()} == {
        nodes[0].pk: (300, 5), nodes[1].pk: (125, 0), nodes[2].pk: (300, 5)}
    _, (lost,) = downtime.job_downtime(job.pk, timezone.now())
    assert (lost.instance_id, lost.resume_step, lost.resume_tier) == (nodes[1].pk, 125, "memory")
    # Gone at step 130: 30 steps past storage's checkpoint, 5 past the replica the gang went on from.
    assert InterruptionEvent.objects.get(instance=nodes[1]).steps_lost == 5


@pytest.mark.parametrize("claimed", [100, 131, 10**9])
def test_a_memory_resume_outside_what_the_gang_reached_is_not_believed(db, settings, claimed):
    """Not newer than the checkpoint, or past the furthest step the gang's heartbeats had
    reached: a VM's word moves no money."""
    from respawn_server.jobs.money import costs
    from tests.costs.history import T

    from respawn_server.jobs.recovery.elastic import resumed_from_memory

    job, nodes = memory_tier_regroup(settings, claimed)
    assert job.world_sizes.get(world_size=2).memory_resume_step is None
    said = f"instance {nodes[0].pk} says its gang resumed at step {claimed} from the memory tier, not between"
    resumed_from_memory(Instance.objects.get(pk=nodes[0].pk), step=claimed, generation=1)  # its next heartbeat
    assert job.events.filter(message__contains=said).count() == 1
    assert costs.job_cost(job, T(3, 2)).work[nodes[1].pk].steps_kept == 100
    assert InterruptionEvent.objects.get(instance=nodes[1]).steps_lost == 30  # to the checkpoint at 100


def test_a_memory_resume_is_the_regroup_of_the_gang_the_node_is_in_not_an_earlier_gangs_of_the_same_generation(
        db, settings):
    """A gang relaunched whole counts its generations again: its node's word is about the
    regroup it was in, not the earlier gang's (which named no checkpoint: 125 was "not
    between" its bounds, and the claim was refused at every heartbeat)."""
    job, nodes = memory_tier_regroup(settings, 125, earlier_gang=True)
    assert [(w.reason, w.memory_resume_step) for w in job.world_sizes.filter(world_size=2).order_by("at")] == [
        ("an earlier gang's regroup", None), (f"instance {nodes[1].pk} preempted: the gang goes on with 2 of 3 nodes", 125)]
    assert not job.events.filter(message__contains="not believed").exists()


def test_the_heartbeat_carries_the_memory_resume_once_per_regroup_and_only_for_the_gang_the_node_is_in(elastic):
    job, nodes = elastic
    Instance.objects.filter(job=job).update(registered_at=timezone.now())  # trained: their runs are kept at the regroup
    gone(nodes[1].instance)
    client = APIClient()

    def beat(node, **fields):
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {node.agent_token}")
        return client.post("/api/agent/v1/heartbeat", {"event_id": str(uuid.uuid4()), "step": 52, **fields}, format="json")

    assert beat(nodes[0], memory_resume_step=50, gang_generation=0).status_code == 200  # the gang before: no word
    assert job.world_sizes.get(world_size=2).memory_resume_step is None
    bad = beat(nodes[0], memory_resume_step=-1, gang_generation=1)
    assert bad.status_code == 400 and list(bad.json()["errors"]) == ["memory_resume_step"]
    for node, step in ((nodes[0], 50), (nodes[2], 50), (nodes[2], 51)):  # said by each, and resent
        assert beat(node, memory_resume_step=step, gang_generation=1).status_code == 200
    assert job.world_sizes.get(world_size=2).memory_resume_step == 50
    assert set(Instance.objects.filter(job=job, gang_generation=1).values_list("memory_resume_step", flat=True)) == {50}
    detail = APIClient()
    detail.force_authenticate(job.owner)
    sizes = detail.get(f"/api/v1/jobs/{job.pk}/").json()["world_sizes"]
    assert [(s["world_size"], s["resume_step"], s["resume_tier"]) for s in sizes] == [(3, None, ""), (2, 50, "memory")]
