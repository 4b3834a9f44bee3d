"""A fault-injecting proxy in front of moto's EC2, for the errors moto never makes.

moto always has capacity and quota. This proxy forwards every EC2 call to moto
unchanged, except a RunInstances the test has told to fail: that one gets EC2's
real XML error answer (code, message, HTTP status), optionally only for one
availability zone, so "no capacity in zone a, launched in zone b" can be shown
end to end with the real boto3 client.

    with Ec2FaultProxy(moto_url) as ec2:
        ec2.fail_run_instances("InsufficientInstanceCapacity", status=500, zone="us-east-1a")
        boto3.client("ec2", endpoint_url=ec2.endpoint, ...)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl
from xml.sax.saxutils import escape

import requests

HOP_BY_HOP = {"host", "content-length", "connection", "transfer-encoding", "accept-encoding"}


@dataclass
class RunInstancesFault:
    code: str
    status: int
    message: str
    zone: str | None  # None: whichever zone is asked for
    times: int | None  # None: until cleared


class Ec2FaultProxy:
    def __init__(self, moto_url: str):
        self.moto_url = moto_url.rstrip("/")
        self.faults: list[RunInstancesFault] = []
        self.refused: list[dict[str, str]] = []  # the RunInstances calls answered with a fault
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address
        return f"http://{host}:{port}"

    def fail_run_instances(self, code: str, *, status: int = 400, message: str = "", zone: str | None = None, times: int | None = 1) -> None:
        """Answer the next `times` RunInstances (in `zone`, if given) with this EC2 error."""
        with self._lock:
            self.faults.append(RunInstancesFault(code, status, message or f"emulated {code}", zone, times))

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()

    def _fault_for(self, params: dict[str, str]) -> RunInstancesFault | None:
        if params.get("Action") != "RunInstances":
            return None
        with self._lock:
            for fault in self.faults:
                if fault.zone in (None, params.get("Placement.AvailabilityZone")):
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times == 0:
                            self.faults.remove(fault)
                    self.refused.append(params)
                    return fault
        return None

    def start(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                fault = proxy._fault_for(dict(parse_qsl(body.decode())))
                if fault:
                    self.answer(fault.status, {"Content-Type": "text/xml"}, _error_xml(fault).encode())
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                upstream = requests.post(proxy.moto_url + self.path, data=body, headers=headers, timeout=30)
                kept = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP | {"content-encoding"}}
                self.answer(upstream.status_code, kept, upstream.content)

            def answer(self, status, headers, payload):
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def _error_xml(fault: RunInstancesFault) -> str:
    # EC2's error envelope, as botocore's ec2 parser reads it.
    return (
        f"<Response><Errors><Error><Code>{escape(fault.code)}</Code><Message>{escape(fault.message)}</Message></Error></Errors>"
        "<RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>"
    )
