"""A buddy store in a process of its own, as on a node of the gang:

    RESPAWN_MEMORY_TIER_TOKEN=... python -m respawn.checkpoint.tiers --holds-for 0 [--own 1] [--host 127.0.0.1] [--port 0]

(the token in the environment, not the command line, which every user of the machine
can read), prints `listening <host> <port>` once it accepts connections, then serves until killed.
"""

import argparse
import os

from respawn import protocol

from .buddy import BuddyServer

parser = argparse.ArgumentParser(description="A buddy store: keeps the previous node's ranks' newest verified "
                                             "shards in memory, and its own node's.")
parser.add_argument("--holds-for", type=int, required=True, help="the node (round the gang's ring) whose ranks' "
                                                                 "replicas this node keeps")
parser.add_argument("--own", type=int, default=None, help="this node's own number, whose ranks' shards it keeps too")
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int, default=0)
args = parser.parse_args()
server = BuddyServer(args.holds_for, os.environ.get(protocol.ENV_MEMORY_TIER_TOKEN, ""), args.host, args.port, own=args.own)
print("listening", *server.address, flush=True)
server.serve_forever()
