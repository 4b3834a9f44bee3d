"""A stand-in for the control plane's agent API that records what arrives, for
reporter tests that need answers the real server never gives on cue (5xx, 429,
nonsense bodies) and for bench/notice.py, which times arrivals. By default it
answers as the control plane does. The integration tests use the real control plane.

    plane = StandInControlPlane(job).start()  # register hands the agent `job`
    ...
    plane.wait_for(lambda a: a[1] == "exit", 60, "exit report")
    plane.stop()
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from respawn import protocol
from tests.emulators.serving import LocalHttpServer


def agent_argv(tmp_path: Path, url: str, *, register_timeout_s: float = 5) -> list[str]:
    """`respawn-agent run` against `url` (a stand-in), with short intervals, its work dir under `tmp_path`."""
    token = tmp_path / "token"
    token.write_text("rsp_boot_x")
    token.chmod(0o600)
    return [sys.executable, "-m", "respawn.agent", "run", "--control-plane-url", url, "--bootstrap-token-file", str(token), "--provider", "local",
            "--metadata-url", "http://127.0.0.1:9", "--work-dir", str(tmp_path / "work"), "--tick-s", "0.05", "--backoff-base-s", "0.05",
            "--backoff-max-s", "0.2", "--register-timeout-s", str(register_timeout_s), "--drain-timeout-s", "10"]


class StandInControlPlane(LocalHttpServer):
    def __init__(self, job: protocol.JobSpec | None = None):
        super().__init__()
        self.arrivals: list[tuple[float, str, dict]] = []  # (epoch, path, body) of every call, as it came
        self.accepted: list[tuple[str, dict]] = []  # (path, body), first delivery of each event_id
        self.seen_event_ids: set[str] = set()
        self.status = 200  # what every call answers next
        self.body = None  # overrides the JSON answer when set (a str is sent raw)
        self.register_status, self.register_answer = 200, None  # what `register` answers
        self.rendezvous_addr = ""  # what GET `rendezvous` answers (rank 0's address, once it registered)
        if job is not None:
            self.register_answer = protocol.to_dict(protocol.RegisterAnswer(agent_token="standin-agent-token", job=job))
        self.cond = threading.Condition()

    @property
    def url(self) -> str:
        return self.endpoint

    def handler_class(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                arrived = time.time()
                doc = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                path = self.path.removeprefix(protocol.API_PREFIX)
                with outer.cond:
                    outer.arrivals.append((arrived, path, doc))
                    outer.cond.notify_all()
                    status, body = outer.status, outer.body
                    if path == protocol.PATH_REGISTER:
                        status, body = outer.register_status, outer.register_answer
                    if status == 200 and doc["event_id"] not in outer.seen_event_ids:
                        outer.seen_event_ids.add(doc["event_id"])
                        outer.accepted.append((path, doc))
                if body is None:
                    body = protocol.to_dict(protocol.HeartbeatAnswer() if path == protocol.PATH_HEARTBEAT else protocol.Ack())
                self._answer(status, body)

            def do_GET(self):
                path = self.path.removeprefix(protocol.API_PREFIX)
                with outer.cond:
                    outer.arrivals.append((time.time(), path, {}))
                    outer.cond.notify_all()
                    answer = protocol.RendezvousAnswer(rendezvous_addr=outer.rendezvous_addr)
                status = 200 if path == protocol.PATH_RENDEZVOUS else 404
                self._answer(status, protocol.to_dict(answer) if status == 200 else {"detail": "Not found."})

            def _answer(self, status: int, body) -> None:
                raw = (body if isinstance(body, str) else json.dumps(body)).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        return Handler

    def wait_for(self, predicate, timeout: float, what: str) -> tuple[float, str, dict]:
        """The first arrival `predicate` accepts, waiting up to `timeout` seconds for it."""
        end = time.monotonic() + timeout
        with self.cond:
            while True:
                found = [a for a in self.arrivals if predicate(a)]
                if found:
                    return found[0]
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {what} within {timeout}s")
                self.cond.wait(left)
