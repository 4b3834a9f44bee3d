"""The node's buddy store of the memory tier (docs/memory-tier.md): a multi-node job's
agent keeps the replicas of the previous node's ranks and of its own node's (one rank a
node, or torchrun's several) in its own memory, so they outlive the trainer (an elastic
gang's regroup kills it; the state is wanted then). Nodes are numbered by the job's node
rank, which torchrun takes as its --node-rank (PET_NODE_RANK, supervisor.gang_env): its
ranks are then the store's.

It listens on the address this node reaches the gang's rendezvous from, not on every
interface, on a port of the kernel's choosing, and refuses any request without its token:
a fresh random one per agent, never sent to the control plane. Both reach this node's
trainer in its environment; the ranks exchange them on their own group
(tiers/replicator.py `join_ring`), so only the gang's trainers learn them.
"""

from __future__ import annotations

import secrets
import socket
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from respawn import protocol
from respawn.agent.client import DELIVERED
from respawn.checkpoint.tiers import BuddyServer, ReplicaUnavailable, Shard, held_for, replicate, status

HANDOVER_SILENT_S = 5.0  # a spare's store silent this long: the hand-over is given up (the VM is going)

if TYPE_CHECKING:
    from respawn.agent.lifecycle import Agent


def gang_facing_address(rendezvous_addr: str) -> str:
    """This node's address on the route to the gang's rendezvous (rank 0's own, on rank 0):
    no packet is sent, the kernel only picks the source address it would use."""
    host, _, port = rendezvous_addr.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, int(port)))
        return probe.getsockname()[0]


def put_in_env(agent: Agent, env: dict[str, str]) -> None:
    """The store's address and token in the environment of the trainer about to start, the
    store started on the first call and told whose replicas to keep in the gang as it is
    now; neither for a job whose env does not ask for the tier (RESPAWN_MEMORY_TIER=on),
    nor for a job of one node (an elastic gang may have shrunk to one) unless it is a
    spare whose store took its noticed VM's state (`stand_by_for_handover`)."""
    job = agent.state.job
    assert job is not None
    env.pop(protocol.ENV_MEMORY_TIER_ADDR, None)
    env.pop(protocol.ENV_MEMORY_TIER_TOKEN, None)
    if job.env.get(protocol.ENV_MEMORY_TIER) != "on":
        return
    if (job.world_size < 2 or not job.rendezvous_addr) and not (job.handover_token and agent.state.buddy_store):
        return
    store = agent.state.buddy_store
    if store is None:
        store = agent.state.buddy_store = BuddyServer(held_for(job.rank, job.world_size), secrets.token_urlsafe(32),
                                                      gang_facing_address(job.rendezvous_addr), own=job.rank).start()
        agent.agent_line(f"memory tier: this node keeps a buddy's replica, store at {store.address[0]}:{store.address[1]}")
    store.hold_for(held_for(job.rank, job.world_size), own=job.rank)  # a new trainer: its steps restart where it resumes
    host, port = store.address
    env.update({protocol.ENV_MEMORY_TIER_ADDR: f"{host}:{port}", protocol.ENV_MEMORY_TIER_TOKEN: store.token})


def stand_by_for_handover(agent: Agent) -> None:
    """A spare of a job with the tier (its job spec carries the store's token): start the
    node's store before it says it is ready, and tell the control plane where it listens,
    so the VM it stands by for hands its notice save straight into it. Listening where the
    gang's rendezvous is reached from, or for a job of one node where the control plane
    is: the address this VM's peers in the job's network reach it at. A store the control
    plane cannot be told of is closed: the notice save then goes to storage alone."""
    job = agent.state.job
    assert job is not None
    if not job.handover_token or agent.state.buddy_store is not None:
        return
    toward = job.rendezvous_addr or _host_port(agent.config.control_plane_url)
    store = BuddyServer(held_for(job.rank, job.world_size), job.handover_token, gang_facing_address(toward),
                        own=job.rank).start()
    host, port = store.address
    outcome = agent.client.post(protocol.PATH_HANDOVER, protocol.to_dict(protocol.Handover(address=f"{host}:{port}")))
    if outcome.kind != DELIVERED:
        store.close()
        agent.agent_line(f"memory tier: the control plane was not told of this spare's store ({outcome.status or ''} "
                         f"{outcome.detail[:200]}); its noticed VM's state comes from storage")
        return
    agent.state.buddy_store = store
    agent.agent_line(f"memory tier: this spare's store at {host}:{port} takes the noticed VM's state")


def _host_port(url: str) -> str:
    parsed = urlsplit(url)
    return f"{parsed.hostname}:{parsed.port or (443 if parsed.scheme == 'https' else 80)}"


def hand_over_this_nodes_shards(agent: Agent) -> None:
    """Once the trainer has exited, in a gang handed over whole to its spares (its stop named
    this node's spare's store, `handover`): the newest replica of each of this node's ranks,
    which its trainers put in this node's store, goes to the spare's store, so the spares'
    gang finds the step whole there; not one the spare holds at that step or a newer one
    (the noticed node's trainers often sent theirs themselves). Bounded by the store's
    silence rule; a failure leaves the spares to storage."""
    handover, store, job = agent.state.handover, agent.state.buddy_store, agent.state.job
    if handover is None or store is None or job is None:
        return
    spare = _address(handover["address"])
    try:
        # What its trainers handed over themselves stays: a put of an older step, arriving once
        # the spare's trainer has re-formed its store, would replace it.
        held = {(rank, step) for rank, step, *_ in status(spare, handover["token"])["replicas"]}
    except ReplicaUnavailable as exc:
        agent.agent_line(f"memory tier: nothing handed to the spare: {exc}")
        return
    for replica in store.newest_of(job.rank):
        if any(rank == replica.rank and step >= replica.step for rank, step in held):
            continue
        shard = Shard(replica.rank, replica.step, replica.files, replica.digests, replica.gang)
        try:
            replicate(spare, handover["token"], shard, HANDOVER_SILENT_S, node=handover["node"])
        except ReplicaUnavailable as exc:
            agent.agent_line(f"memory tier: rank {replica.rank}'s step {replica.step} not handed to the spare: {exc}")
            continue
        agent.agent_line(f"memory tier: rank {replica.rank}'s step {replica.step} handed to the spare's store at "
                         f"{handover['address']}")


def _address(host_port: str) -> tuple[str, int]:
    host, _, port = host_port.rpartition(":")
    return host, int(port)
