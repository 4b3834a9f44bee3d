"""A rank's side of the memory tier: replicate its shard to its buddy, fetch it back.

Every failure is a ReplicaUnavailable that says why (buddy unreachable, refused, torn,
failed its digest); falling back to storage is the caller's decision.
"""

from __future__ import annotations

import socket
from contextlib import nullcontext

from ..errors import CheckpointError
from . import wire
from .shard import Shard

CONNECT_TIMEOUT_S = 5.0


class ReplicaUnavailable(CheckpointError):
    """The buddy holds no replica that can be trusted, or cannot be reached."""


def _connect(address: tuple[str, int], silent_s: float | None, cancel: wire.Cancel | None = None) -> socket.socket:
    """A stream to the store on which the store silent for `silent_s` (default
    wire.PEER_SILENT_S) fails the call: a send to a node gone without a word, or to a hung
    store, ends, and so does a strict K's wait for it (tiers/pacing.py). `cancel` set
    while connecting: Cancelled."""
    try:
        sock = wire.connect(address, CONNECT_TIMEOUT_S, cancel)
    except OSError as exc:
        raise ReplicaUnavailable(f"buddy {address[0]}:{address[1]} unreachable ({exc})") from None
    wire.set_idle_timeout(sock, silent_s or wire.PEER_SILENT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _answer(sock: socket.socket, address, what: str) -> dict:
    try:
        reply = wire.recv_frame(sock)
    except (wire.Torn, OSError) as exc:
        raise ReplicaUnavailable(f"buddy {address[0]}:{address[1]}: {what} torn ({exc})") from None
    if not reply.get("ok"):
        raise ReplicaUnavailable(f"buddy {address[0]}:{address[1]} refused the {what}: {reply.get('reason')}")
    return reply


def replicate(address: tuple[str, int], token: str, shard: Shard, silent_s: float | None = None,
              cancel: wire.Cancel | None = None, *, node: int | None = None) -> dict:
    """Put `shard` into the buddy's memory; returns once the buddy has verified it and
    serves it (the previous replica is served until then), with the files' digests (those
    computed on the way where the shard had none). `token`: the buddy store's. `node`: the
    sender's node round the ring (default: its rank, one rank a node). `cancel` set: the put
    is cut (between chunks, or at once where it waits on the store), the buddy drops it."""
    try:
        sock = _connect(address, silent_s, cancel)
    except wire.Cancelled:
        raise ReplicaUnavailable(f"buddy {address[0]}:{address[1]}: put of step {shard.step} given up: a save "
                                 f"took its buffers (while connecting)") from None
    with sock:
        try:
            with cancel.cutting(sock) if cancel is not None else nullcontext():
                files = [[name, len(memoryview(data).cast("B"))] for name, data in shard.files.items()]
                wire.send_frame(sock, {"op": "put", "token": token, "rank": shard.rank, "step": shard.step,
                                       "node": shard.rank if node is None else node, "gang": shard.gang,
                                       "files": files})
                _answer(sock, address, f"put of step {shard.step}")
                digests = [wire.send_body(sock, data, shard.digests.get(name) is None, cancel) or shard.digests[name]
                           for name, data in shard.files.items()]
                wire.send_frame(sock, {"digests": digests})
                _answer(sock, address, f"put of step {shard.step}")
        except (wire.Cancelled, ReplicaUnavailable, OSError) as exc:
            if cancel is not None and cancel.is_set():
                raise ReplicaUnavailable(f"buddy {address[0]}:{address[1]}: put of step {shard.step} given up: a save "
                                         f"took its buffers") from None
            if isinstance(exc, ReplicaUnavailable):
                raise
            raise ReplicaUnavailable(f"buddy {address[0]}:{address[1]}: put of step {shard.step} cut ({exc})") from None
        return dict(zip(shard.files, digests))


def fetch(address: tuple[str, int], token: str, rank: int, silent_s: float | None = None,
          step: int | None = None) -> Shard:
    """Rank `rank`'s newest verified replica from its buddy (or its replica of `step`),
    checked again on arrival."""
    with _connect(address, silent_s) as sock:
        try:
            wire.send_frame(sock, {"op": "get", "token": token, "rank": rank, "step": step})
        except OSError as exc:
            raise ReplicaUnavailable(f"buddy {address[0]}:{address[1]}: fetch cut ({exc})") from None
        reply = _answer(sock, address, f"fetch of rank {rank}")
        files, digests = {}, {}
        try:
            for name, size, digest in wire.file_list(reply, with_digest=True):
                files[name], got = wire.recv_body(sock, size)
                if got != digest:
                    raise ReplicaUnavailable(f"buddy {address[0]}:{address[1]}: {name} of step {reply['step']} failed its digest in transit")
                digests[name] = digest
        except (wire.Torn, OSError) as exc:
            raise ReplicaUnavailable(f"buddy {address[0]}:{address[1]}: fetch of rank {rank} torn ({exc})") from None
        return Shard(rank, reply["step"], files, digests, str(reply.get("gang", "")))


def settle(address: tuple[str, int], token: str, rank: int, step: int) -> None:
    """Tell the store that rank `rank`'s step `step` is whole on the gang's stores: it
    drops that rank's older replicas."""
    with _connect(address, CONNECT_TIMEOUT_S) as sock:
        wire.send_frame(sock, {"op": "settle", "token": token, "rank": rank, "step": step})
        _answer(sock, address, f"settle of step {step}")


def status(address: tuple[str, int], token: str) -> dict:
    """What the buddy holds: {"keeps": [node, ...] (whose ranks' puts it takes), "replicas": [[rank, step, bytes, gang], ...],
    "receiving": bytes of a put in progress}."""
    with _connect(address, CONNECT_TIMEOUT_S) as sock:
        wire.send_frame(sock, {"op": "status", "token": token})
        reply = _answer(sock, address, "status")
        return {key: reply[key] for key in ("keeps", "replicas", "receiving")}
