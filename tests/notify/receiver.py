"""A real HTTP server on 127.0.0.1 that receives webhooks the way a user's would: it
checks the signature with the secret it was shown, and answers as told (200, a 5xx,
or too late)."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict
    body: bytes
    signature_ok: bool | None  # None: no secret to check with (Slack format, or not told yet)
    at: float = field(default_factory=time.time)

    def json(self):
        return json.loads(self.body)


def verify(secret: str, headers: dict, body: bytes, *, max_age_s: float = 300) -> bool:
    """What a receiver does: recompute HMAC-SHA256 over `{timestamp}.{body}` and compare in
    constant time, refusing an old timestamp (a replay)."""
    timestamp = headers.get("X-Respawn-Timestamp", "")
    if not timestamp.isdigit() or abs(time.time() - int(timestamp)) > max_age_s:
        return False
    expected = "sha256=" + hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, headers.get("X-Respawn-Signature", ""))


@dataclass
class Receiver:
    """Paths answer by their first part: /ok/… 200, /fail/… 500 (`failure_body`), /slow/…
    after `slow_s`."""

    slow_s: float = 3.0
    failure_body: bytes = b"down for maintenance"
    secrets: dict[str, str] = field(default_factory=dict)  # path -> the secret shown for it
    received: list[Received] = field(default_factory=list)

    def __post_init__(self):
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                headers = dict(self.headers.items())
                secret = receiver.secrets.get(self.path)
                receiver.received.append(Received(self.path, headers, body,
                                                  verify(secret, headers, body) if secret else None))
                if self.path.startswith("/slow/"):
                    time.sleep(receiver.slow_s)
                code = 500 if self.path.startswith("/fail/") else 200
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(receiver.failure_body if code == 500 else b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def at(self, path: str) -> list[Received]:
        return [r for r in self.received if r.path == path]

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
