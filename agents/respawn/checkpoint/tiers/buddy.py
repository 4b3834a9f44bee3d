"""A node's buddy store: keeps the newest verified shard of each rank of the previous node
round the ring and, beside them, its own node's ranks' (one a node, or torchrun's several),
and serves them back (DESIGN §12). Its own outlive their trainers, which a regroup kills:
with both, one node lost leaves every rank's shard on some node, the lost ones' on its
buddy.

A put is received into fresh buffers while the previous replica stays served, and is
published only once every byte has arrived and matched its digest; a torn or mismatched
put is dropped and the previous one stays. Each kept rank's newest replica and, until the
gang says the newest step is whole (`settle`: every rank's replica of it has landed), the
one before are held: a node lost while a replication lands leaves the previous step whole
on the nodes left. Puts are taken one at a time, so a receipt in progress holds at most
one more shard. Before a replica
is served it is digested again: host memory can rot, and nothing unverified leaves.

Every request carries the store's token (compared in constant time): the store holds a
rank's whole training state, so what can reach its port but is not of the gang (another
tenant of the network, a scanner) must neither read nor replace it. The token is no
encryption: the gang's network sees it pass, as it sees the replicas' bytes.

On a node the agent runs it (agents/respawn/agent/memory_tier.py); alone:
`python -m respawn.checkpoint.tiers` (tiers/__main__.py).
"""

from __future__ import annotations

import hmac
import mmap
import socket
import socketserver
import threading
from dataclasses import dataclass

from .. import manifest
from . import wire


def _own_pages(size: int):
    """A replica's bytes in pages of their own (an anonymous map), which go back to the
    system the moment the replica is dropped. A bytearray this large may instead stay in
    the malloc arena of the thread that received it (each put has a thread of its own),
    and the node would hold a dropped replica's memory beside the one it keeps."""
    return mmap.mmap(-1, size) if size else bytearray()


@dataclass(frozen=True)
class Replica:
    form: int  # of the gang, as the store counts its `hold_for` calls
    gang: str  # the sender's run of the gang (Shard.gang)
    rank: int
    node: int  # the sender's node round the ring
    step: int
    files: dict  # name -> its bytes (_own_pages), never written after it is published
    digests: dict

    @property
    def nbytes(self) -> int:
        return sum(len(data) for data in self.files.values())


class BuddyServer:
    """`holds_for` is the node whose ranks' puts it takes, and `own` its own node (None: only
    the other's), as the gang's nodes are numbered round the ring; each put names its
    sender's node. The agent calls `hold_for` when its gang re-forms (docs/elastic.md). The
    replicas it held stay served, for their ranks, until the new form's first verified put
    replaces them, whatever that put's step: a gang resumed from an older checkpoint counts
    its steps again from there."""

    def __init__(self, holds_for: int, token: str, host: str = "127.0.0.1", port: int = 0,
                 idle_timeout_s: float = wire.PEER_SILENT_S, own: int | None = None):
        if not token:
            raise ValueError("a buddy store needs a token: it must not serve a rank's state to anyone who asks")
        self.keeps = self._keeps(holds_for, own)
        self._form = 0
        self._token = token.encode()
        self.idle_timeout_s = idle_timeout_s
        self.replicas: dict[int, tuple[Replica, ...]] = {}  # by rank, oldest first, at most two
        self.receiving = 0  # bytes of the put being received, beside the replica
        self._one_put = threading.Lock()
        store = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                store._serve(self.request)

        self._server = socketserver.ThreadingTCPServer((host, port), Handler, bind_and_activate=False)
        self._server.daemon_threads = True
        self._server.allow_reuse_address = True
        self._server.server_bind()
        self._server.server_activate()

    @staticmethod
    def _keeps(holds_for: int, own: int | None) -> tuple[int, ...]:
        return tuple(sorted({holds_for} | ({own} if own is not None else set())))

    def hold_for(self, node: int, own: int | None = None) -> None:
        """The gang re-formed (or its trainer restarted): take the puts of `node`'s and `own`'s ranks from now on."""
        with self._one_put:
            self.keeps = self._keeps(node, own)
            self._form += 1

    @property
    def token(self) -> str:
        return self._token.decode()

    @property
    def address(self) -> tuple[str, int]:
        return self._server.server_address[:2]

    def start(self) -> "BuddyServer":
        threading.Thread(target=self.serve_forever, name="buddy-store", daemon=True).start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def newest_of(self, node: int) -> list[Replica]:
        """The newest replica of each rank of node `node` it holds (its agent hands its own
        node's over to a spare: agent/memory_tier.py)."""
        return [versions[-1] for versions in self.replicas.values() if versions[-1].node == node]

    def _serve(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # A silent peer's put is dropped: it cannot hold the one-put slot, and the replica it
        # would have replaced, forever.
        wire.set_idle_timeout(sock, self.idle_timeout_s)
        try:
            request = wire.recv_frame(sock)
            op = request.get("op")
            token = request.get("token")
            if not isinstance(token, str) or not hmac.compare_digest(token.encode(), self._token):
                wire.send_frame(sock, {"ok": False, "reason": "the request's token is not this store's"})
            elif op == "put":
                self._put(sock, request)
            elif op == "get":
                self._get(sock, request)
            elif op == "status":
                held = [replica for versions in self.replicas.values() for replica in versions]
                wire.send_frame(sock, {"ok": True, "keeps": list(self.keeps), "receiving": self.receiving,
                                       "replicas": [[r.rank, r.step, r.nbytes, r.gang] for r in held]})
            elif op == "settle":
                self._settle(sock, request)
            else:
                wire.send_frame(sock, {"ok": False, "reason": f"unknown op {op!r}"})
        except (wire.Torn, OSError):
            pass  # the peer went away or fell silent: what it was sending is dropped, the replica stays

    def _put(self, sock: socket.socket, request: dict) -> None:
        rank, step, gang = request.get("rank"), request.get("step"), str(request.get("gang", ""))
        node = request.get("node", rank)
        rows = wire.file_list(request, with_digest=False)
        if type(rank) is not int or node not in self.keeps:
            kept = " and ".join(f"node {n}'s" for n in self.keeps)
            return wire.send_frame(sock, {"ok": False, "reason": f"this store keeps the replicas of {kept} ranks, "
                                                                 f"not of node {node}'s (rank {rank})"})
        if type(step) is not int:
            return wire.send_frame(sock, {"ok": False, "reason": f"step {step!r} is not a whole number"})
        with self._one_put:
            held = self.replicas.get(rank, (None,))[-1]
            if held is not None and held.form == self._form and step <= held.step:
                return wire.send_frame(sock, {"ok": False, "reason": f"step {step} is not newer than the replica's step {held.step}"})
            wire.send_frame(sock, {"ok": True, "reason": ""})  # go: the bytes are wanted
            files, computed = {}, {}
            try:
                self.receiving = sum(size for _, size in rows)
                for name, size in rows:
                    files[name], computed[name] = wire.recv_body(sock, size, alloc=_own_pages)
                digests = wire.recv_frame(sock).get("digests")
            finally:
                self.receiving = 0
            if not isinstance(digests, list) or len(digests) != len(rows):
                return wire.send_frame(sock, {"ok": False, "reason": "the put's digests are missing"})
            expected = {name: digest for (name, _), digest in zip(rows, digests)}
            bad = [name for name in files if computed[name] != expected[name]]
            if bad:
                return wire.send_frame(sock, {"ok": False, "reason": f"step {step}: {', '.join(bad)} failed the {manifest.ALGORITHM} digest on receipt"})
            # One assignment: a fetch sees the old replicas or the new ones, never a mix. An older
            # form's replicas go with the new form's first: the regroup has read them by then.
            previous = self.replicas
            mine = tuple(kept for kept in previous.get(rank, ()) if kept.form == self._form)[-1:]
            self.replicas = {r: kept for r, kept in previous.items() if kept[-1].form == self._form and r != rank} | {
                rank: (*mine, Replica(self._form, gang, rank, node, step, files, expected))}
            # The sender waits for this verdict, not for the oldest shard's pages to be freed;
            # they are freed before the next put or settle may start (both take the lock), and
            # this thread keeps no reference (not even to the new replica's files) past it: a
            # thread descheduled on its way out would keep pages a later settle drops.
            wire.send_frame(sock, {"ok": True, "reason": ""})
            del previous, mine, held, files

    def _settle(self, sock: socket.socket, request: dict) -> None:
        """Rank `rank`'s step `step` is whole on the gang's stores: the replicas before it go."""
        rank, step = request.get("rank"), request.get("step")
        with self._one_put:
            versions = self.replicas.get(rank, ())
            if type(step) is int and any(kept.step >= step for kept in versions):
                self.replicas[rank] = tuple(kept for kept in versions if kept.step >= step)
            # The dropped replicas' pages go before the answer, as a put's do: this local was
            # the last reference, and the gang counts on the room once its settle returns.
            del versions
        wire.send_frame(sock, {"ok": True, "reason": ""})

    def _get(self, sock: socket.socket, request: dict) -> None:
        """Rank `rank`'s replica of step `step`, or its newest when the request names none."""
        rank, step = request.get("rank"), request.get("step")
        versions = self.replicas.get(rank, ()) if isinstance(rank, int) else ()
        held = next((kept for kept in reversed(versions) if step is None or kept.step == step), None)
        if held is None:
            which = "" if step is None else f" of step {step}"
            return wire.send_frame(sock, {"ok": False, "reason": f"no replica of rank {rank}{which} has arrived complete and verified"})
        rotten = [name for name, data in held.files.items() if manifest.digest_bytes(data) != held.digests[name]]
        if rotten:
            return wire.send_frame(sock, {"ok": False, "reason": f"step {held.step}: {', '.join(rotten)} no longer match their digest in the buddy's memory"})
        wire.send_frame(sock, {"ok": True, "step": held.step, "gang": held.gang,
                               "files": [[name, len(data), held.digests[name]] for name, data in held.files.items()]})
        for data in held.files.values():
            wire.send_body(sock, data, digest_it=False)

