"""A proxy in front of moto that forwards every call unchanged unless a subclass
answers it itself: the base of the proxies that give moto's EC2 behaviour it lacks
(tests/emulators/ec2_faults.py, tests/pricing/spot_history_proxy.py).

A subclass overrides `handle(path, params, body, headers)`; it may call
`forward` (with the body as it came or one of its own) and reshape moto's answer.
"""

from __future__ import annotations

from email.message import Message
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qsl

import requests

from tests.emulators.serving import LocalHttpServer

HOP_BY_HOP = {"host", "content-length", "connection", "transfer-encoding", "accept-encoding"}
Reply = tuple[int, dict[str, str], bytes]  # (status, headers, payload)


class MotoProxy(LocalHttpServer):
    def __init__(self, moto_url: str):
        super().__init__()
        self.moto_url = moto_url.rstrip("/")

    def handle(self, path: str, params: dict[str, str], body: bytes, headers: Message) -> Reply:
        """The answer to one call (`params`: its decoded form body); by default, moto's."""
        return self.forward(path, body, headers)

    def forward(self, path: str, body: bytes | str, headers: Message) -> Reply:
        """Send `body` to moto with the caller's end-to-end headers; moto's answer, as it can be re-sent."""
        sent = {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}
        upstream = requests.post(self.moto_url + path, data=body, headers=sent, timeout=30)
        kept = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP | {"content-encoding"}}
        return upstream.status_code, kept, upstream.content

    def handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, headers, payload = proxy.handle(self.path, dict(parse_qsl(body.decode())), body, self.headers)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        return Handler
