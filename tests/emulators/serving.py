"""The life cycle every local test server shares: serve a request handler on 127.0.0.1
on a free port from a daemon thread, as a context manager.

    class Mine(LocalHttpServer):
        def handler_class(self) -> type[BaseHTTPRequestHandler]: ...

    with Mine() as server:
        requests.get(server.endpoint + "/x")
"""

from __future__ import annotations

import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LocalHttpServer:
    def __init__(self, *, ssl_context: ssl.SSLContext | None = None):
        self._ssl_context = ssl_context
        self._server: ThreadingHTTPServer | None = None

    def handler_class(self) -> type[BaseHTTPRequestHandler]:
        """The handler serving this server's requests (it may close over `self`)."""
        raise NotImplementedError

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{'https' if self._ssl_context else 'http'}://{host}:{port}"

    def start(self):
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler_class())
        self._server.daemon_threads = True
        if self._ssl_context:
            self._server.socket = self._ssl_context.wrap_socket(self._server.socket, server_side=True)
        # A short poll interval: stop() waits up to one interval, and tests stop many servers.
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name=type(self).__name__, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
