"""A multi-node job's agent runs the node's buddy store of the memory tier
(agents/respawn/agent/memory_tier.py) under the real agent and control plane: bound to the
address the node reaches its gang on, refusing what lacks its token, told to keep the
previous rank's replica, named to the trainer in its environment; a gang regrouped down
to one node trains without it; a job that did not ask for it (RESPAWN_MEMORY_TIER=on in its
env) runs none."""

from __future__ import annotations

import json

import pytest

from respawn import protocol
from respawn.checkpoint.tiers import ReplicaUnavailable, status
from respawn_server.jobs.fleet.reconciler import _end_gone
from tests.agent.test_elastic_agent import started_pair
from tests.conftest import wait_until

pytestmark = pytest.mark.e2e

SAYS_ITS_STORE = ("import json, os, sys, time; f = open(sys.argv[1], 'a'); "
                  "f.write(json.dumps({k: os.environ.get(k) for k in ('RANK', 'WORLD_SIZE', "
                  f"'{protocol.ENV_MEMORY_TIER_ADDR}', '{protocol.ENV_MEMORY_TIER_TOKEN}')}}) + '\\n'); f.close(); "
                  "time.sleep(120)")


def test_a_gangs_node_runs_a_buddy_store_on_the_gangs_address_that_wants_its_token(
        team_setup, child_env, web_server, tmp_path, imds):
    agent, rank0, rank1, starts = started_pair(team_setup, child_env, web_server, tmp_path, imds, SAYS_ITS_STORE,
                                               env={protocol.ENV_MEMORY_TIER: "on"})
    try:
        first = json.loads(starts.read_text())
        host, _, port = first[protocol.ENV_MEMORY_TIER_ADDR].rpartition(":")
        token = first[protocol.ENV_MEMORY_TIER_TOKEN]
        assert host == "127.0.0.1"  # the rendezvous' side, not 0.0.0.0
        # Rank 0 of 2 keeps rank 1's replica and its own; none has come yet.
        assert status((host, int(port)), token) == {"keeps": [0, 1], "replicas": [], "receiving": 0}
        with pytest.raises(ReplicaUnavailable, match="token is not this store's"):
            status((host, int(port)), "a guess")

        _end_gone(rank1, "the cloud says gone")  # the gang regroups to this node alone
        wait_until(lambda: starts.read_text().count("\n") == 2, timeout=60, what="the trainer's restart", proc=agent)
    finally:
        agent.stop(9)
    second = json.loads(starts.read_text().splitlines()[1])
    assert (second["RANK"], second["WORLD_SIZE"]) == ("0", "1")
    assert second[protocol.ENV_MEMORY_TIER_ADDR] is None and second[protocol.ENV_MEMORY_TIER_TOKEN] is None
    assert "memory tier: this node keeps a buddy's replica, store at 127.0.0.1:" in agent.output()


def test_a_gang_that_did_not_ask_for_the_tier_runs_no_store(team_setup, child_env, web_server, tmp_path, imds):
    agent, rank0, rank1, starts = started_pair(team_setup, child_env, web_server, tmp_path, imds, SAYS_ITS_STORE)
    agent.stop(9)
    first = json.loads(starts.read_text())
    assert (first["WORLD_SIZE"], first[protocol.ENV_MEMORY_TIER_ADDR], first[protocol.ENV_MEMORY_TIER_TOKEN]) == \
        ("2", None, None)
    assert "memory tier" not in agent.output()
