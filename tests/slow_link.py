"""A slow network link on 127.0.0.1: a TCP proxy whose uploads (client to server) share
one rate limit while it is set, as a VM's link to a far or congested bucket does. Downloads
pass at loopback speed.

Used where a test needs a storage write that cannot meet a notice's window while the
node's other links (its peers, its spare) stay fast: the bucket emulator stays the real
server, and only the wire to it is slowed."""

from __future__ import annotations

import socket
import threading
import time

CHUNK = 4096


class SlowLink:
    def __init__(self, upstream: tuple[str, int], upload_bytes_per_s: float | None = None):
        self.upstream = upstream
        self.rate = upload_bytes_per_s  # None: no limit; may be changed while connections are open
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._lock = threading.Lock()
        self._next_free = time.monotonic()  # when the link has sent everything it was given
        self._closed = threading.Event()

    @property
    def url(self) -> str:
        host, port = self._listener.getsockname()
        return f"http://{host}:{port}"

    def start(self) -> SlowLink:
        threading.Thread(target=self._accept, name="slow-link", daemon=True).start()
        return self

    def stop(self) -> None:
        self._closed.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, throttled: bool) -> None:
        try:
            while chunk := source.recv(CHUNK):
                if throttled and self.rate:
                    self._take(len(chunk))
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def _take(self, size: int) -> None:
        """Wait until the link, shared by every connection, has carried `size` more bytes."""
        with self._lock:
            now = time.monotonic()
            self._next_free = max(self._next_free, now) + size / self.rate
            until = self._next_free
        time.sleep(max(0.0, until - time.monotonic()))
