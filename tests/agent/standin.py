"""A stand-in for the control plane's agent API, for reporter tests that need
answers the real server never gives on cue (5xx, 429, nonsense bodies).
The integration tests use the real control plane."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from agents.protocol import API_PREFIX


class StandInControlPlane:
    def __init__(self):
        self.accepted: list[tuple[str, dict]] = []  # (path, body), first delivery of each event_id
        self.seen_event_ids: set[str] = set()
        self.status = 200  # what every call answers next
        self.body = None  # overrides the JSON answer when set (a str is sent raw)
        self.register_status, self.register_answer = 200, None  # what `register` answers
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = self.path.removeprefix(API_PREFIX)
                with outer.lock:
                    status, body = outer.status, outer.body
                    if path == "register":
                        status, body = outer.register_status, outer.register_answer
                    if status == 200:
                        doc = json.loads(data)
                        if doc["event_id"] not in outer.seen_event_ids:
                            outer.seen_event_ids.add(doc["event_id"])
                            outer.accepted.append((path, doc))
                if body is None:
                    body = {"action": "continue"} if path == "heartbeat" else {"ok": True}
                raw = (body if isinstance(body, str) else json.dumps(body)).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return "http://%s:%d" % self.httpd.server_address[:2]

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
