"""A TCP proxy in front of the live web server that resets connections in the middle
of an answer, as a flaky network, a NAT timing out or a restarting balancer does.

    with ResettingProxy(web_server.url) as proxy:
        proxy.reset_answers(3)   # the next 3 answers are cut halfway with a TCP reset
        ... RESPAWN_URL=proxy.url ...
"""

from __future__ import annotations

import select
import socket
import struct
import threading
from urllib.parse import urlparse


def _reset(sock: socket.socket) -> None:
    """Close with RST instead of FIN: the peer reads ECONNRESET."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


class ResettingProxy:
    def __init__(self, upstream_url: str):
        parsed = urlparse(upstream_url)
        self.upstream = (parsed.hostname, parsed.port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.resets_done = 0
        self._resets_left: int | None = 0  # None: every answer
        self._lock = threading.Lock()

    def __enter__(self) -> "ResettingProxy":
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.listener.close()

    def reset_answers(self, count: int | None) -> None:
        """Cut the next `count` answers (None: all of them from now on)."""
        with self._lock:
            self._resets_left = count

    def _take_reset(self) -> bool:
        with self._lock:
            if self._resets_left == 0:
                return False
            if self._resets_left is not None:
                self._resets_left -= 1
            self.resets_done += 1
            return True

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        """Both directions in one thread: a socket is reset only when no other thread
        is blocked on it (a blocked recv would keep it open and the RST unsent)."""
        upstream = socket.create_connection(self.upstream)
        peer = {client: upstream, upstream: client}
        try:
            while True:
                readable, _, _ = select.select(list(peer), [], [])
                for source in readable:
                    data = source.recv(65536)
                    if not data:
                        return
                    if source is upstream and self._take_reset():
                        client.sendall(data[: len(data) // 2])
                        _reset(client)
                        _reset(upstream)
                        return
                    peer[source].sendall(data)
        except OSError:
            pass
        finally:
            client.close()
            upstream.close()
