"""The memory tier end to end (docs/memory-tier.md): an elastic 3-node job (nodes 2..3) on
the local provider, each node's agent running its buddy store, the trainer
`respawn.examples.tiny_gang` (DistributedDataParallel over gloo, packed checkpoints)
replicating every K steps: one rank a node, or two a node under torchrun as a multi-GPU
node runs them. One node's VM is killed outright between two checkpoints; the two
survivors regroup and resume from the replicas in their stores, not from the older
checkpoint in storage: at most K steps lost, and the job ends with bitwise the state of
the same training done by hand (3 nodes' ranks to the step resumed from, then 2 nodes').

Real processes throughout: gunicorn, a Celery worker and beat, three detached local
"VMs", each running the agent, which runs its node's store and its ranks (under
torchrun: torchrun, which runs them)."""

import re
import sys
from pathlib import Path

import pytest
from django.db.models import Max
from django.test import Client

from respawn.checkpoint import layout
from respawn.checkpoint.reader import CheckpointRef, load
from respawn.checkpoint.storage import open_storage
from respawn.examples.dcp_loop import first_difference
from respawn_server.jobs.core.choices import JobStatus
from respawn_server.jobs.models import Job, LogChunk, StepPoint
from respawn_server.jobs.money import costs
from tests.conftest import wait_until
from tests.e2e.stack import GANG_LIVENESS, elastic_gang_stack, kill_a_gangs_node, run_ranks_by_hand
from tests.history import job_story

STEPS, EVERY, K, GLOBAL_BATCH = 150, 30, 5, 24
TRAIN = [sys.executable, "-m", "respawn.examples.tiny_gang", "--steps", str(STEPS), "--every-steps", str(EVERY),
         "--global-batch", str(GLOBAL_BATCH)]
RESUMED = re.compile(r"rank (\d) resumed at step (\d+) from the memory tier")


def torchrun(train: list[str], ranks_per_node: int) -> list[str]:
    """`train` under torchrun as a user's job command gives it: no --nnodes, --node-rank or
    master, which the agent's PET_* variables fill in (agent/supervisor.py gang_env)."""
    if ranks_per_node == 1:
        return train
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks_per_node), *train[1:]]


# The elastic regroup's store behaviour is tests/e2e/test_elastic.py's, on both stores: this
# module's own part, the replicas, lives in the trainers and the agents' buddy stores.
pytestmark = pytest.mark.store_incidental


def final_states(uri: str, world: int) -> list[dict]:
    """Each rank's final state but Python's and NumPy's RNGs, which tiny never seeds (each
    process starts them from the OS) nor uses: torch's it seeds, and that one is kept."""
    states = [load(CheckpointRef(open_storage(uri), layout.step_dir(STEPS)), rank).state for rank in range(world)]
    for state in states:
        state["rng"] = {"torch": state["rng"]["torch"]}
    return states


@pytest.fixture
def liveness():
    return GANG_LIVENESS


@pytest.fixture(params=[1, 2], ids=["one-rank-a-node", "torchrun-two-ranks-a-node"])
def elastic_job(request, child_env, web_server, tmp_path):
    # No growing back: the gang ends at 2 nodes, so the reference is 3 nodes' ranks then 2's.
    command = torchrun([*TRAIN, "--report", "--step-delay", "0.1"], request.param)
    with elastic_gang_stack(child_env, web_server.url, tmp_path, command, STEPS, grow_retry_s=3600,
                            env={"RESPAWN_MEMORY_TIER": "on", "RESPAWN_REPLICA_EVERY_STEPS": str(K)}) as running:
        yield *running, request.param


def newest_step(job: Job) -> int:
    return StepPoint.objects.filter(instance__job=job).aggregate(top=Max("step"))["top"] or 0


@pytest.mark.e2e
def test_a_node_killed_outright_costs_at_most_k_steps_and_the_survivors_resume_bitwise_from_memory(elastic_job, tmp_path):
    job, vms, worker, per_node = elastic_job
    latest = Path(job.storage_uri) / "LATEST"
    # Past the first checkpoint by more than K steps, well before the second: the replicas are newer.
    wait_until(lambda: Job.objects.get(pk=job.pk).status == JobStatus.RUNNING and latest.exists()
               and EVERY + 2 * K <= newest_step(job) < 2 * EVERY - 2 * K,
               timeout=240, what="the gang to train past its first checkpoint", proc=worker, interval=0.1,
               explain=lambda: job_story(job.pk, vms))
    first, _, story = kill_a_gangs_node(job, vms, worker, 1)
    sizes = list(job.world_sizes.order_by("at", "id").select_related("resume_checkpoint"))
    assert [w.world_size for w in sizes] == [3, 2], story
    regrouped_at, in_storage = sizes[1].at, sizes[1].resume_checkpoint
    assert in_storage is not None, story

    # Each survivor's ranks say they resumed from the memory tier, all at one step R, newer
    # than the checkpoint storage held (the one the control plane named); under torchrun the
    # lost node's ranks from the next node's store.
    resumed = {}
    for survivor in (first[0], first[2]):
        lines = [line for chunk in LogChunk.objects.filter(instance=survivor) for line in chunk.lines]
        resumed |= {int(m.group(1)): int(m.group(2)) for line in lines if (m := RESUMED.search(line))}
    assert sorted(resumed) == list(range(2 * per_node)) and len(set(resumed.values())) == 1, story
    step = resumed[0]
    # The furthest the gang got: the survivors' steps before their trainers were stopped for
    # the regroup (the lost node's last ones may not have been shipped before it died).
    reached = StepPoint.objects.filter(instance__in=(first[0], first[2]), time__lt=regrouped_at).aggregate(
        top=Max("step"))["top"]
    assert in_storage.step < step <= reached, story
    assert reached - step <= K < reached - in_storage.step, story  # storage alone would have lost more than K
    # The control plane learnt it from the survivors' heartbeats: the regroup went on from R in
    # the memory tier, the lost node's work counts to R, and the job page says so.
    regroup = job.world_sizes.get(pk=sizes[1].pk)
    assert (regroup.resume_step, regroup.resume_tier) == (step, "memory"), story
    assert costs.job_cost(job).work[first[1].pk].steps_kept == step, story
    page = Client()
    page.force_login(job.owner)
    assert f"step {step} (memory tier)" in page.get(f"/jobs/{job.pk}/").content.decode()

    # The same training by hand: 3 nodes' ranks to step R, then 2 nodes' from the checkpoint they left.
    reference = tmp_path / "reference"
    run_ranks_by_hand(TRAIN, reference, 3 * per_node, step)
    run_ranks_by_hand(TRAIN, reference, 2 * per_node, STEPS)
    ours, theirs = final_states(job.storage_uri, 2 * per_node), final_states(str(reference), 2 * per_node)
    assert [first_difference(a, b) for a, b in zip(ours, theirs)] == [None] * 2 * per_node
