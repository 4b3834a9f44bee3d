"""A small threaded JSON-over-HTTP(S) server that the cloud emulators build on.

Routes are (method, regex) pairs; a handler gets the match, the query and the
decoded JSON body and returns (status, body, headers). Every request is logged
so a test can assert what the "cloud" received.
"""

from __future__ import annotations

import json
import re
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from tests.emulators.serving import LocalHttpServer

Reply = tuple[int, dict | None, dict[str, str]]
Handler = Callable[[re.Match, dict[str, str], dict | None], Reply]


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    query: dict[str, str]
    body: dict | None
    headers: dict[str, str]


class JsonHttpEmulator(LocalHttpServer):
    """Serves on 127.0.0.1 on a free port from a daemon thread; use as a context manager."""

    def __init__(self, *, ssl_context: ssl.SSLContext | None = None):
        super().__init__(ssl_context=ssl_context)
        self.routes: list[tuple[str, re.Pattern, Handler]] = []
        self.received: list[Received] = []
        self.lock = threading.RLock()

    def route(self, method: str, pattern: str, handler: Handler) -> None:
        self.routes.append((method, re.compile(pattern + r"/?$"), handler))

    def handler_class(self) -> type[BaseHTTPRequestHandler]:
        emulator = self

        class RequestHandler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def handle_any(self):
                url = urlsplit(self.path)
                query = {key: values[-1] for key, values in parse_qs(url.query).items()}
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw.strip() else None
                with emulator.lock:
                    emulator.received.append(Received(self.command, url.path, query, body, dict(self.headers)))
                    status, answer, headers = emulator.dispatch(self.command, url.path, query, body)
                payload = json.dumps(answer).encode() if answer is not None else b""
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                if answer is not None:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = handle_any

            def log_message(self, *args):
                pass

        return RequestHandler

    def dispatch(self, method: str, path: str, query: dict[str, str], body: dict | None) -> Reply:
        for route_method, pattern, handler in self.routes:
            match = pattern.match(path)
            if route_method == method and match:
                return handler(match, query, body)
        return 404, {"error": {"code": 404, "message": f"emulator has no route for {method} {path}"}}, {}

    def requests_to(self, method: str, path_fragment: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.method == method and path_fragment in r.path]
