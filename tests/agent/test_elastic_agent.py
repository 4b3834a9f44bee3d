"""A node of an elastic gang (docs/elastic.md) under a real agent and the real control
plane: a regroup restarts its trainer with its new rank, world size and rendezvous; a
trainer that fails on its own waits for the control plane's word and, with every peer
still there, ends the node failed with its own exit code. The worker's part
(`check_elastic_gang`, a Celery task) is run by the test where it would be nudged."""

from __future__ import annotations

import json
import sys

import pytest

from respawn_server.jobs.core.choices import EndReason, InstanceState, JobStatus
from respawn_server.jobs.fleet.reconciler import _end_gone, check_elastic_gang
from respawn_server.jobs.models import Instance, InstanceEvent
from tests.agent.live import AgentProcess
from tests.conftest import wait_until
from tests.factories import make_instance, make_job

pytestmark = pytest.mark.e2e


# Writes the gang it was started in, one JSON line a start, then trains (sleeps) on.
SAYS_ITS_GANG = ("import json, os, sys, time; f = open(sys.argv[1], 'a'); "
                 "f.write(json.dumps({k: os.environ.get(k) for k in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', "
                 "'MASTER_PORT', 'RESPAWN_RESUME_FROM')}) + '\\n'); f.close(); time.sleep(120)")


def elastic_pair(team_setup, tmp_path, command, **fields):
    """A 2-node elastic job (nodes_min 1) running; rank 1 never registered and has no VM id."""
    job = make_job(team_setup.team, team_setup.people["admin"].user, nodes=2, nodes_min=1, command=command,
                   checkpoint_uri=str(tmp_path / "ckpt"), status=JobStatus.RUNNING, **fields)
    rank0 = make_instance(job, rank=0, rendezvous_addr="127.0.0.1:29411")
    rank1 = make_instance(job, rank=1, state=InstanceState.RUNNING, rendezvous_addr="127.0.0.1:29411")
    return job, rank0, rank1.instance


def agent_for(setup, child_env, tmp_path, web_server, imds):
    return AgentProcess(child_env, tmp_path, url=web_server.url, bootstrap_token=setup.bootstrap_token,
                        provider="aws", metadata_url=imds.url).start()


def started_pair(team_setup, child_env, web_server, tmp_path, imds, script: str, **fields):
    """The pair's rank 0 under its agent, once its trainer, `script`, started: it writes one
    JSON line a start to the returned file. The caller stops the agent."""
    starts = tmp_path / "starts.jsonl"
    job, rank0, rank1 = elastic_pair(team_setup, tmp_path, [sys.executable, "-c", script, str(starts)], **fields)
    agent = agent_for(rank0, child_env, tmp_path, web_server, imds)
    try:
        wait_until(lambda: starts.exists() and starts.read_text().count("\n") == 1, timeout=60,
                   what="the trainer's first start", proc=agent)
    except BaseException:
        agent.stop(9)
        raise
    return agent, rank0, rank1, starts


def test_a_regroup_restarts_the_trainer_in_the_new_gang(team_setup, child_env, web_server, tmp_path, imds):
    agent, rank0, rank1, starts = started_pair(team_setup, child_env, web_server, tmp_path, imds, SAYS_ITS_GANG)
    try:
        _end_gone(rank1, "the cloud says gone")  # what the reconciler does for a vanished VM
        wait_until(lambda: starts.read_text().count("\n") == 2, timeout=60, what="the trainer's restart", proc=agent)
    finally:
        agent.stop(9)
    first, second = (json.loads(line) for line in starts.read_text().splitlines())
    assert (first["RANK"], first["WORLD_SIZE"], first["MASTER_PORT"]) == ("0", "2", "29411")
    now = Instance.objects.get(pk=rank0.instance.pk)
    assert (second["RANK"], second["WORLD_SIZE"]) == ("0", "1") and now.gang_generation == 1
    assert f"{second['MASTER_ADDR']}:{second['MASTER_PORT']}" == now.rendezvous_addr != "127.0.0.1:29411"
    assert "the gang regrouped (generation 1): rank 0 of 1" in agent.output()
    assert now.state == InstanceState.RUNNING  # the same VM trains on


def test_a_failing_trainer_waits_for_the_word_and_with_its_peers_there_ends_failed_with_its_code(
        team_setup, child_env, web_server, tmp_path, imds):
    job, rank0, rank1 = elastic_pair(team_setup, tmp_path, [sys.executable, "-c", "raise SystemExit(3)"])
    agent = agent_for(rank0, child_env, tmp_path, web_server, imds)
    try:
        wait_until(lambda: Instance.objects.get(pk=rank0.instance.pk).trainer_exited_at is not None, timeout=60,
                   what="the node to say its trainer exited", proc=agent)
        assert Instance.objects.get(pk=rank0.instance.pk).state == InstanceState.RUNNING  # waiting, not ended
        # What the nudge runs. Neither node has a VM the cloud could call gone (rank 0's id is the
        # metadata emulator's, which no provider here knows: forgotten, as if never launched).
        Instance.objects.filter(pk=rank0.instance.pk).update(provider_instance_id="")
        check_elastic_gang(job.pk)
        wait_until(lambda: Instance.objects.get(pk=rank0.instance.pk).state == InstanceState.ENDED, timeout=60,
                   what="the node to end", proc=agent)
    finally:
        agent.stop(9)
    assert Instance.objects.get(pk=rank0.instance.pk).end_reason == EndReason.FAILED
    assert InstanceEvent.objects.filter(instance_id=rank0.instance.pk, message="agent exit: failed (code 3)").exists()
    assert "the trainer exited (code 3); as a node of an elastic gang, waiting" in agent.output()
