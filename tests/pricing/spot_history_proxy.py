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

import xml.etree.ElementTree as ET
from urllib.parse import urlencode
from xml.sax.saxutils import escape

from tests.emulators.moto_proxy import MotoProxy

NS = "{http://ec2.amazonaws.com/doc/2016-11-15}"


class SpotHistoryProxy(MotoProxy):
    def __init__(self, moto_url: str):
        super().__init__(moto_url)
        self.extra_rows: list[dict[str, str]] = []
        self.pages_served: list[dict[str, str]] = []  # each history call's parameters

    def handle(self, path, params, body, headers):
        if params.get("Action") != "DescribeSpotPriceHistory":
            return super().handle(path, params, body, headers)
        self.pages_served.append(params)
        whole = {k: v for k, v in params.items() if k not in ("MaxResults", "NextToken")}
        _, _, upstream = self.forward(path, urlencode(whole), headers)
        region = _signed_region(headers.get("Authorization", ""))
        rows = [{child.tag.removeprefix(NS): child.text for child in item}
                for item in ET.fromstring(upstream).iter(f"{NS}item")]
        rows += [row for row in self.extra_rows if row["availabilityZone"].startswith(region)]
        start = int(params.get("NextToken") or 0)
        end = start + int(params.get("MaxResults") or 1000)
        return 200, {"Content-Type": "text/xml"}, _history_xml(rows[start:end], str(end) if end < len(rows) else "").encode()


def _signed_region(authorization: str) -> str:
    # SigV4: "... Credential=AKID/20261101/us-east-1/ec2/aws4_request, ..." (EC2's endpoint is per region).
    return authorization.split("Credential=", 1)[-1].split("/")[2] if "Credential=" in authorization else ""


def _history_xml(rows: list[dict[str, str]], next_token: str) -> str:
    items = "".join("<item>" + "".join(f"<{k}>{escape(v)}</{k}>" for k, v in row.items()) + "</item>" for row in rows)
    token = f"<nextToken>{next_token}</nextToken>" if next_token else ""
    return (f'<DescribeSpotPriceHistoryResponse xmlns="{NS[1:-1]}"><requestId>proxy</requestId>'
            f"<spotPriceHistorySet>{items}</spotPriceHistorySet>{token}</DescribeSpotPriceHistoryResponse>")
