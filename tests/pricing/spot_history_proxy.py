"""A proxy in front of moto's EC2 that pages DescribeSpotPriceHistory as EC2 does.

moto answers every history in one page and only with placeholder rows. This proxy
forwards the call to moto unchanged, adds the rows a test gives it (real-looking
prices, broken ones), then answers `MaxResults` rows at a time with a `nextToken`,
so boto3's own paginator walks real pages. A given row is served to the region its
zone is in. Every other call passes through.

    with SpotHistoryProxy(moto_url) as ec2:
        ec2.extra_rows.append({"availabilityZone": "us-east-1a", "instanceType": "g5.xlarge",
                               "productDescription": "Linux/UNIX", "spotPrice": "abc",
                               "timestamp": "2026-11-01T00:00:00.000Z"})
"""

from __future__ import annotations

import threading
import xml.etree.ElementTree as ET
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlencode
from xml.sax.saxutils import escape

import requests

NS = "{http://ec2.amazonaws.com/doc/2016-11-15}"
PASSED_HEADERS = {"authorization", "x-amz-date", "content-type", "user-agent"}


class SpotHistoryProxy:
    def __init__(self, moto_url: str):
        self.moto_url = moto_url.rstrip("/")
        self.extra_rows: list[dict[str, str]] = []
        self.pages_served: list[dict[str, str]] = []  # each history call's parameters
        self._server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address
        return f"http://{host}:{port}"

    def start(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                params = dict(parse_qsl(self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()))
                headers = {k: v for k, v in self.headers.items() if k.lower() in PASSED_HEADERS}
                if params.get("Action") != "DescribeSpotPriceHistory":
                    upstream = requests.post(proxy.moto_url + self.path, data=params, headers=headers, timeout=30)
                    self.answer(upstream.status_code, upstream.content)
                    return
                proxy.pages_served.append(params)
                whole = {k: v for k, v in params.items() if k not in ("MaxResults", "NextToken")}
                upstream = requests.post(proxy.moto_url + self.path, data=urlencode(whole), headers=headers, timeout=30)
                region = _signed_region(self.headers.get("Authorization", ""))
                rows = [{child.tag.removeprefix(NS): child.text for child in item}
                        for item in ET.fromstring(upstream.content).iter(f"{NS}item")]
                rows += [row for row in proxy.extra_rows if row["availabilityZone"].startswith(region)]
                start = int(params.get("NextToken") or 0)
                end = start + int(params.get("MaxResults") or 1000)
                self.answer(200, _history_xml(rows[start:end], str(end) if end < len(rows) else "").encode())

            def answer(self, status, payload):
                self.send_response(status)
                self.send_header("Content-Type", "text/xml")
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


def _signed_region(authorization: str) -> str:
    # SigV4: "... Credential=AKID/20261101/us-east-1/ec2/aws4_request, ..." (EC2's endpoint is per region).
    return authorization.split("Credential=", 1)[-1].split("/")[2] if "Credential=" in authorization else ""


def _history_xml(rows: list[dict[str, str]], next_token: str) -> str:
    items = "".join("<item>" + "".join(f"<{k}>{escape(v)}</{k}>" for k, v in row.items()) + "</item>" for row in rows)
    token = f"<nextToken>{next_token}</nextToken>" if next_token else ""
    return (f'<DescribeSpotPriceHistoryResponse xmlns="{NS[1:-1]}"><requestId>proxy</requestId>'
            f"<spotPriceHistorySet>{items}</spotPriceHistorySet>{token}</DescribeSpotPriceHistoryResponse>")
