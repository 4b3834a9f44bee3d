"""The memory tier (DESIGN §12, issue 37): a rank's host snapshot replicated into its
buddy node's host memory over TCP, digest-checked on receipt and again before it is
served. The agent runs a node's store (agents/respawn/agent/memory_tier.py), the packed
writer replicates to it (replicator.py), a regrouped gang resumes from it (restore.py);
docs/memory-tier.md says what is left.

    server = BuddyServer(held_for(node, nodes), token, own=node).start()  # on every node
    client.replicate(address_of_buddy, token, Shard(rank, step, files, {}), node=node)  # every K steps
    shard = client.fetch(address_of_buddy, token, rank)   # or ReplicaUnavailable, saying why
"""

from .buddy import BuddyServer
from .client import ReplicaUnavailable, fetch, replicate, settle, status
from .shard import Ring, Shard, buddy_of, held_for, shard_from_storage

__all__ = ["BuddyServer", "ReplicaUnavailable", "Ring", "Shard", "buddy_of", "fetch", "held_for", "replicate", "settle",
           "shard_from_storage", "status"]
