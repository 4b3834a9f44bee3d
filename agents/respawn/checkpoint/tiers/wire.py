"""The memory tier's bytes on a TCP stream: JSON frames (4-byte length, then the text)
and file bodies, digested chunk by chunk on both ends as they pass.

A put:   {"op": "put", "rank", "step", "files": [[name, size], ...]}; the buddy answers
         {"ok", "reason"} (a refusal before any byte is sent), then the files' bytes in
         that order, then {"digests": [...]}; the buddy answers {"ok", "reason"} again.
A fetch: {"op": "get", "rank"}; the buddy answers {"ok": true, "step", "files":
         [[name, size, digest], ...]} and the bytes, or {"ok": false, "reason"}.
The digests trail the bytes so that a sender can digest a file as it sends it.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import select
import socket
import struct
import threading
import time
from contextlib import contextmanager

from .. import manifest

CHUNK = 8 << 20
MAX_FRAME = 16 << 20
# A peer silent this long is gone (a node lost without a FIN or RST, a store hung): on
# either end the stream fails, so nothing waits on it for the kernel's retransmission
# timeout (about a quarter of an hour). No chunk takes a healthy peer this long.
PEER_SILENT_S = 60.0
_LENGTH = struct.Struct(">I")


class Torn(Exception):
    """The peer closed the stream, or sent something that is not this protocol."""


class Cancelled(Exception):
    """The sender gave the put up (its buffers are wanted)."""


class Cancel:
    """A put's give-up (a save wants its buffers). Set, it stops the put before its next
    chunk, and a put blocked on its store (one that reads and answers nothing: hung, or
    its node gone without a FIN) at once, by shutting the stream down, not PEER_SILENT_S
    later: the save waiting for the buffers may be a notice's, with seconds of window."""

    def __init__(self):
        self._lock = threading.Lock()
        self._set = False
        self._streams: set[socket.socket] = set()

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        with self._lock:
            self._set = True
            streams = list(self._streams)
        for sock in streams:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a send or receive blocked on it, in any thread
            except OSError:
                pass

    @contextmanager
    def cutting(self, sock: socket.socket):
        """While inside, `set` shuts `sock` down."""
        with self._lock:
            if self._set:
                raise Cancelled("given up")
            self._streams.add(sock)
        try:
            yield
        finally:
            with self._lock:
                self._streams.discard(sock)


CONNECT_POLL_S = 0.1


def connect(address: tuple[str, int], timeout_s: float, cancel: Cancel | None = None) -> socket.socket:
    """A stream to `address`, or OSError (a timeout after `timeout_s`). Polled, so that
    `cancel` set gives it up at once, Cancelled: a connect to a node gone without a word
    gets no answer at all, and the save that wants the buffers must not wait it out."""
    family, kind, proto, _, where = socket.getaddrinfo(*address, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setblocking(False)
        code = sock.connect_ex(where)
        deadline = time.monotonic() + timeout_s
        # poll, not select: a trainer's process often holds over 1,023 descriptors
        # (DataLoader workers pass tensors by fd), past what select() can watch.
        writable = select.poll()
        writable.register(sock, select.POLLOUT)
        while code == errno.EINPROGRESS:
            if cancel is not None and cancel.is_set():
                raise Cancelled("given up while connecting")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer in {timeout_s:g} s")
            if writable.poll(CONNECT_POLL_S * 1000):
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            raise OSError(code, os.strerror(code))
        sock.setblocking(True)
        return sock
    except BaseException:
        sock.close()
        raise


def send_frame(sock: socket.socket, body: dict) -> None:
    text = json.dumps(body).encode()
    sock.sendall(_LENGTH.pack(len(text)) + text)


def set_idle_timeout(sock: socket.socket, seconds: float) -> None:
    """A receive or a send that waits this long fails, but in the kernel (SO_RCVTIMEO,
    SO_SNDTIMEO): Python's own timeout would poll before every recv, a receive could not
    wait for a whole chunk, and it bounds a whole sendall, not a stall within it."""
    whole = int(seconds)
    value = struct.pack("ll", whole, int((seconds - whole) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    filled = 0
    while filled < len(view):
        got = sock.recv_into(view[filled:], 0, socket.MSG_WAITALL)  # a chunk in one call, not one per segment
        if not got:
            raise Torn(f"the stream ended {len(view) - filled} bytes short")
        filled += got


def recv_frame(sock: socket.socket) -> dict:
    head = bytearray(_LENGTH.size)
    _recv_exact(sock, memoryview(head))
    (length,) = _LENGTH.unpack(head)
    if length > MAX_FRAME:
        raise Torn(f"a {length}-byte frame is not this protocol")
    text = bytearray(length)
    _recv_exact(sock, memoryview(text))
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise Torn(f"a frame is not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise Torn("a frame is not a JSON object")
    return body


def send_body(sock: socket.socket, data, digest_it: bool, cancel=None) -> str | None:
    """Send one file's bytes; their digest when asked (computed on the way, chunk by chunk).
    `cancel` (a Cancel) set: Cancelled before the next chunk."""
    view = memoryview(data).cast("B")
    digest = manifest.new_digest() if digest_it else None
    for offset in range(0, len(view), CHUNK):
        if cancel is not None and cancel.is_set():
            raise Cancelled("given up")
        chunk = view[offset : offset + CHUNK]
        if digest is not None:
            digest.update(chunk)
        sock.sendall(chunk)
    return digest.hexdigest() if digest is not None else None


def recv_body(sock: socket.socket, size: int, alloc=bytearray) -> tuple[bytearray | mmap.mmap, str]:
    """One file's bytes, straight into their final buffer (`alloc(size)`), and their digest."""
    data = alloc(size)
    view = memoryview(data)
    digest = manifest.new_digest()
    for offset in range(0, size, CHUNK):
        chunk = view[offset : offset + CHUNK]
        _recv_exact(sock, chunk)
        digest.update(chunk)
    return data, digest.hexdigest()


def file_list(body: dict, with_digest: bool) -> list:
    """The frame's files, checked to be [name, size(, digest)] rows."""
    rows = body.get("files")
    width = 3 if with_digest else 2
    if not isinstance(rows, list) or not all(
        isinstance(row, list) and len(row) == width and isinstance(row[0], str)
        and type(row[1]) is int and row[1] >= 0 for row in rows
    ):
        raise Torn("the frame's file list is malformed")
    if len({row[0] for row in rows}) != len(rows):
        raise Torn("the frame names a file twice")
    return rows
