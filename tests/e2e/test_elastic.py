"""An elastic 3-node job (nodes 2..3, docs/elastic.md) on the local provider, end to
end: one node's VM killed outright, the other two train on without a new VM, re-ranked
into a gang of 2 from the newest checkpoint (resharded by torch.distributed.checkpoint);
capacity being there, a joiner boots, the gang checkpoints and grows back to 3 with it;
the job finishes with bitwise the weights of a run that did the same by hand: 3 ranks up
to the first resume checkpoint, 2 up to the second, then 3.

Real processes throughout: gunicorn, a Celery worker and beat, three detached local
"VMs", each running the agent, which runs its rank of `respawn.examples.dcp_loop`
(DistributedDataParallel over gloo, sharded checkpoints)."""

import json
import sys
from pathlib import Path

import pytest

from respawn_server.jobs.core.choices import EndReason, JobStatus
from respawn_server.jobs.models import Checkpoint, Instance, Job, LogChunk, StepPoint
from respawn_server.jobs.money import costs
from tests.conftest import wait_until
from tests.e2e.stack import GANG_LIVENESS, elastic_gang_stack, kill_a_gangs_node, run_ranks_by_hand
from tests.history import job_story

STEPS, EVERY, NODES = 120, 10, 3
TRAIN = [sys.executable, "-m", "respawn.examples.dcp_loop", "--wrap", "ddp", "--steps", str(STEPS), "--every",
         str(EVERY), "--global-batch", "6"]


def final_data_digests(uri: Path) -> dict[str, str]:
    """The digests of the final checkpoint's DCP data files, as its manifest lists them."""
    manifest = json.loads((uri / f"step-{STEPS:08d}" / "MANIFEST.json").read_text())
    return {name: entry["digest"] for name, entry in manifest["files"].items() if name.endswith(".distcp")}


@pytest.fixture
def liveness():
    return GANG_LIVENESS


@pytest.fixture
def elastic_job(child_env, web_server, tmp_path):
    with elastic_gang_stack(child_env, web_server.url, tmp_path, [*TRAIN, "--step-delay", "0.1"], STEPS,
                            grow_retry_s=0) as running:
        yield running


@pytest.mark.e2e
def test_a_node_killed_outright_leaves_two_training_on_they_grow_back_to_three_and_finish_exactly(elastic_job, tmp_path):
    job, vms, worker = elastic_job
    wait_until(lambda: Job.objects.get(pk=job.pk).status == JobStatus.RUNNING
               and Checkpoint.objects.filter(job=job, step__gt=0).exists(),
               timeout=180, what="the gang to run and commit a checkpoint", proc=worker, interval=0.2,
               explain=lambda: job_story(job.pk, vms))
    first, killed_at, story = kill_a_gangs_node(job, vms, worker, 1)

    # The two survivors trained on, re-ranked 0 and 1 of 2, without a new VM; then one joiner
    # (rank 2) was launched, and at the checkpoint asked for once it was ready the three
    # regrouped. One preemption; growing is none.
    rows = list(Instance.objects.filter(job=job).order_by("pk").select_related("resume_checkpoint"))
    assert [i.pk for i in rows[:NODES]] == [i.pk for i in first] and len(rows) == NODES + 1, story
    survivors, joiner = (rows[0], rows[2]), rows[3]
    assert rows[1].end_reason in (EndReason.PREEMPTED, EndReason.LOST), story
    assert [(i.rank, i.world_size, i.gang_generation, i.end_reason) for i in (*survivors, joiner)] == [
        (0, 3, 2, EndReason.COMPLETED), (1, 3, 2, EndReason.COMPLETED), (2, 3, 2, EndReason.COMPLETED)], story
    assert (job.preemptions, job.failure_restarts) == (1, 0), story
    sizes = list(job.world_sizes.order_by("at", "id").select_related("resume_checkpoint"))
    assert [w.world_size for w in sizes] == [3, 2, 3], story
    shrunk_at, grown_at = sizes[1].resume_checkpoint, sizes[2].resume_checkpoint
    assert shrunk_at is not None and grown_at is not None and 0 < shrunk_at.step < grown_at.step < STEPS, story
    assert {i.resume_checkpoint_id for i in (*survivors, joiner)} == {grown_at.pk}, story
    assert [run["kept_until"] for run in survivors[0].earlier_runs] == [shrunk_at.step, grown_at.step]
    for survivor in survivors:
        log = "\n".join(line for chunk in LogChunk.objects.filter(instance=survivor) for line in chunk.lines)
        assert "the gang regrouped (generation 1): rank" in log and "the gang regrouped (generation 2): rank" in log
        # Training again after the kill: steps past the resume step, reported since.
        assert StepPoint.objects.filter(instance=survivor, step__gt=shrunk_at.step, time__gt=killed_at).exists(), story
    assert StepPoint.objects.filter(instance=joiner, step__gt=grown_at.step).exists(), story
    # The savings baseline counts the work done: 3 nodes to the first resume step, 2 to the
    # second, 3 to the end; each survivor all of it, the lost node and the joiner their part.
    kept = {pk: w.steps_kept for pk, w in costs.job_cost(job).work.items()}
    assert kept == {rows[0].pk: STEPS, rows[1].pk: shrunk_at.step, rows[2].pk: STEPS,
                    joiner.pk: STEPS - grown_at.step}, story

    # The same training by hand: 3 ranks up to the checkpoint the survivors resumed from,
    # 2 up to the one the grown gang resumed from, then 3.
    reference = tmp_path / "reference"
    run_ranks_by_hand(TRAIN, reference, 3, shrunk_at.step)
    run_ranks_by_hand(TRAIN, reference, 2, grown_at.step)
    run_ranks_by_hand(TRAIN, reference, 3, STEPS)
    ours = final_data_digests(Path(job.storage_uri))
    assert ours and ours == final_data_digests(reference)
