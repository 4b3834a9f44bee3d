"""An instance metadata service on 127.0.0.1 in the AWS, GCP or Azure flavour.

The local provider's "VM" supervisor serves one so its agent watches for notices
exactly as it would on a cloud, and the tests use it as the emulator of each
cloud's metadata service. It serves the real paths, headers and JSON shapes
(DESIGN §7, EMULATORS.md):

- aws: IMDSv2 token (`PUT /latest/api/token`, 401 without or with an expired
  token), `spot/instance-action` (404 until a notice), `spot/termination-time`,
  `events/recommendations/rebalance`, `instance-id`.
- gcp: `/computeMetadata/v1/instance/preempted` (403 without `Metadata-Flavor:
  Google`), long-polled with `wait_for_change`, `last_etag`, `timeout_sec`.
- azure: `/metadata/scheduledevents` (400 without `Metadata: true` or
  `api-version`), a `Preempt` event with an RFC 1123 `NotBefore`, acknowledged by
  POSTing `{"StartRequests": [{"EventId": ...}]}`. As in an availability set or a
  scale set's placement group, it also lists the events of other VMs (`vm` of a
  notice): each event's `Resources` names the VM it is for.

Control calls under `/_respawn/` (no headers needed) drive it:
`POST /_respawn/notice {"in_s", "deadline_in_s", "kind": "preempt"|"rebalance", "vm"}`,
`POST /_respawn/garbage {"status", "body", "content_type", "times"}` (the next
answers on the notice path; status 0 drops the connection unanswered),
`POST /_respawn/expire-tokens`, `GET /_respawn/state`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import secrets
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

FLAVOURS = ("aws", "gcp", "azure")
CONTROL_PREFIX = "/_respawn/"
NOTICE_KINDS = ("preempt", "rebalance")

AWS_TOKEN_PATH = "/latest/api/token"
AWS_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
AWS_TOKEN_HEADER = "X-aws-ec2-metadata-token"
AWS_INSTANCE_ACTION = "/latest/meta-data/spot/instance-action"
AWS_TERMINATION_TIME = "/latest/meta-data/spot/termination-time"
AWS_REBALANCE = "/latest/meta-data/events/recommendations/rebalance"
AWS_INSTANCE_ID = "/latest/meta-data/instance-id"
GCP_PREEMPTED = "/computeMetadata/v1/instance/preempted"
GCP_INSTANCE_ID = "/computeMetadata/v1/instance/id"
GCP_NAME = "/computeMetadata/v1/instance/name"
GCP_ZONE = "/computeMetadata/v1/instance/zone"
GCP_PROJECT_NUMBER = "123456789012"  # instance/zone answers projects/<number>/zones/<zone>
AZURE_EVENTS = "/metadata/scheduledevents"
AZURE_INSTANCE_ID = "/metadata/instance/compute/vmId"
AZURE_NAME = "/metadata/instance/compute/name"
NOTICE_PATHS = (AWS_INSTANCE_ACTION, GCP_PREEMPTED, AZURE_EVENTS)

GCP_DEFAULT_WAIT_S = 60.0


@dataclass(kw_only=True)
class CannedAnswer:
    """A scripted answer on the notice path, for garbage-payload tests."""

    status: int = 200  # 0: close the connection without answering
    body: str = ""
    content_type: str = "text/html"
    times: int = 1


def _event_id() -> str:
    return str(uuid.uuid4()).upper()


@dataclass
class MetadataState:
    """What the service currently says. All access under `cond`."""

    instance_id: str = field(default_factory=lambda: f"i-{secrets.token_hex(8)}")
    name: str = ""  # the VM's name (gcp, azure); 404 when empty
    zone: str = ""  # the VM's zone (gcp); 404 when empty
    preempt_at: float | None = None  # epoch seconds the notice becomes visible
    deadline: float | None = None  # epoch seconds the VM goes away
    rebalance_at: float | None = None
    event_id: str = field(default_factory=_event_id)
    # Azure: other VMs' preemptions, (EventId, VM name, visible at, deadline) each.
    neighbour_events: list[tuple[str, str, float, float]] = field(default_factory=list)
    acknowledged: list[str] = field(default_factory=list)
    tokens: dict[str, float] = field(default_factory=dict)  # token -> monotonic expiry
    canned: list[CannedAnswer] = field(default_factory=list)
    notice_reads: int = 0  # answers served on the notice path
    cond: threading.Condition = field(default_factory=threading.Condition)

    def preempt_visible(self, now: float) -> bool:
        return self.preempt_at is not None and now >= self.preempt_at

    def rebalance_visible(self, now: float) -> bool:
        return self.rebalance_at is not None and now >= self.rebalance_at


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _rfc1123(epoch: float) -> str:
    return format_datetime(datetime.fromtimestamp(epoch, timezone.utc), usegmt=True)


class MetadataServer:
    """`MetadataServer("aws").start()` serves on 127.0.0.1 at `.url` until `.stop()`."""

    def __init__(self, flavour: str, *, host: str = "127.0.0.1", port: int = 0, instance_id: str | None = None,
                 name: str | None = None, zone: str = ""):
        """`instance_id`: what the instance-id paths answer (random when None, 404 when empty);
        `name`, `zone`: what GCP's instance/name and instance/zone and Azure's compute/name answer
        (404 when empty; `name` None: random on Azure, where every VM has one, else empty)."""
        if flavour not in FLAVOURS:
            raise ValueError(f"metadata flavour {flavour!r} is not one of {', '.join(FLAVOURS)}")
        self.flavour = flavour
        self.state = MetadataState()
        if instance_id is not None:
            self.state.instance_id = instance_id
        if name is None:
            name = f"vm-{secrets.token_hex(4)}" if flavour == "azure" else ""
        self.state.name, self.state.zone = name, zone
        self._httpd = ThreadingHTTPServer((host, port), _make_handler(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "MetadataServer":
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=f"imds-{self.flavour}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        with self.state.cond:
            self.state.cond.notify_all()

    def schedule_notice(self, *, in_s: float = 0.0, deadline_in_s: float = 120.0, kind: str = "preempt",
                        vm: str | None = None) -> dict:
        """Make a notice visible `in_s` from now, for a VM that goes away `deadline_in_s` from now:
        this one, or on Azure the neighbour named `vm` (its event is listed here too)."""
        if kind not in NOTICE_KINDS:
            raise ValueError(f"notice kind {kind!r} is not one of {', '.join(NOTICE_KINDS)}")
        if in_s < 0 or deadline_in_s < in_s:
            raise ValueError(f"need 0 <= in_s <= deadline_in_s, got in_s={in_s} deadline_in_s={deadline_in_s}")
        neighbour = vm is not None and vm != self.state.name
        if neighbour and (self.flavour != "azure" or kind != "preempt"):
            raise ValueError("only Azure lists another VM's events, and here only its preemptions")
        now = time.time()
        st = self.state
        with st.cond:
            if neighbour:
                st.neighbour_events.append((_event_id(), vm, now + in_s, now + deadline_in_s))
            elif kind == "preempt":
                st.preempt_at, st.deadline = now + in_s, now + deadline_in_s
            else:
                st.rebalance_at = now + in_s
            st.cond.notify_all()
        if in_s > 0:  # wake long-polls when the notice becomes visible
            timer = threading.Timer(in_s, self._notify)
            timer.daemon = True
            timer.start()
        return self.snapshot()

    def add_canned(self, answer: CannedAnswer) -> None:
        with self.state.cond:
            self.state.canned.append(answer)

    def expire_tokens(self) -> None:
        with self.state.cond:
            self.state.tokens = {t: 0.0 for t in self.state.tokens}

    def snapshot(self) -> dict:
        st = self.state
        with st.cond:
            return {
                "flavour": self.flavour,
                "instance_id": st.instance_id,
                "preempt_at": st.preempt_at,
                "deadline": st.deadline,
                "rebalance_at": st.rebalance_at,
                "event_id": st.event_id,
                "neighbour_event_ids": [event[0] for event in st.neighbour_events],
                "acknowledged": list(st.acknowledged),
                "notice_reads": st.notice_reads,
            }

    def _notify(self) -> None:
        with self.state.cond:
            self.state.cond.notify_all()


def _make_handler(server: MetadataServer) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        srv = server

    return Handler


class _Handler(BaseHTTPRequestHandler):
    srv: MetadataServer
    protocol_version = "HTTP/1.1"
    server_version = "respawn-imds"

    def log_message(self, format: str, *args) -> None:  # quiet: tests poll a lot
        pass

    # --- plumbing -------------------------------------------------------------
    def _send(self, status: int, body: str = "", content_type: str = "text/plain", headers: dict | None = None) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _json(self, status: int, obj, headers: dict | None = None) -> None:
        self._send(status, json.dumps(obj), "application/json", headers)

    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _split(self) -> tuple[str, dict[str, str]]:
        parts = urlsplit(self.path)
        return parts.path, {k: v[-1] for k, v in parse_qs(parts.query).items()}

    def _canned(self, path: str) -> bool:
        """Serve a scripted answer on the notice path, if one is queued."""
        if path not in NOTICE_PATHS:
            return False
        st = self.srv.state
        with st.cond:
            st.notice_reads += 1
            if not st.canned:
                return False
            answer = st.canned[0]
            answer.times -= 1
            if answer.times <= 0:
                st.canned.pop(0)
        if answer.status == 0:
            self.close_connection = True
            self.connection.close()
        else:
            self._send(answer.status, answer.body, answer.content_type)
        return True

    # --- verbs ----------------------------------------------------------------
    def do_GET(self) -> None:
        path, query = self._split()
        if path.startswith(CONTROL_PREFIX):
            return self._control_get(path)
        if self._canned(path):
            return
        getattr(self, f"_{self.srv.flavour}_get")(path, query)

    def do_PUT(self) -> None:
        path, _ = self._split()
        if self.srv.flavour == "aws" and path == AWS_TOKEN_PATH:
            return self._aws_token()
        self._body()
        self._send(405 if path.startswith("/latest/") else 404)

    def do_POST(self) -> None:
        path, query = self._split()
        body = self._body()
        if path.startswith(CONTROL_PREFIX):
            return self._control_post(path, body)
        if self.srv.flavour == "azure" and path == AZURE_EVENTS:
            return self._azure_ack(query, body)
        self._send(404 if self.srv.flavour != "aws" else 405)

    # --- control --------------------------------------------------------------
    def _control_get(self, path: str) -> None:
        if path == CONTROL_PREFIX + "state":
            return self._json(200, self.srv.snapshot())
        self._json(404, {"error": f"no control call {path}"})

    def _control_post(self, path: str, body: bytes) -> None:
        try:
            args = json.loads(body or b"{}")
            if not isinstance(args, dict):
                raise ValueError("the body must be a JSON object")
            if path == CONTROL_PREFIX + "notice":
                return self._json(200, self.srv.schedule_notice(**args))
            if path == CONTROL_PREFIX + "garbage":
                self.srv.add_canned(CannedAnswer(**args))
                return self._json(200, {"ok": True})
            if path == CONTROL_PREFIX + "expire-tokens":
                self.srv.expire_tokens()
                return self._json(200, {"ok": True})
        except (ValueError, TypeError) as exc:
            return self._json(400, {"error": str(exc)})
        self._json(404, {"error": f"no control call {path}"})

    # --- aws ------------------------------------------------------------------
    def _aws_token(self) -> None:
        self._body()
        ttl_raw = self.headers.get(AWS_TTL_HEADER, "")
        try:
            ttl = int(ttl_raw)
        except ValueError:
            ttl = 0
        if not 1 <= ttl <= 21600:
            return self._send(400, f"{AWS_TTL_HEADER} must be 1..21600, got {ttl_raw!r}")
        token = secrets.token_urlsafe(32)
        with self.srv.state.cond:
            self.srv.state.tokens[token] = time.monotonic() + ttl
        self._send(200, token, headers={AWS_TTL_HEADER: str(ttl)})

    def _aws_get(self, path: str, query: dict) -> None:
        st = self.srv.state
        token = self.headers.get(AWS_TOKEN_HEADER, "")
        now = time.time()
        with st.cond:
            expiry = st.tokens.get(token)
            if expiry is None or expiry <= time.monotonic():
                st.tokens.pop(token, None)
                authorized = False
            else:
                authorized = True
            preempt = st.preempt_visible(now)
            deadline, rebalance_at = st.deadline, st.rebalance_at
            rebalance = st.rebalance_visible(now)
            instance_id = st.instance_id
        if not authorized:
            return self._send(401, "")
        if path == AWS_INSTANCE_ACTION and preempt:
            return self._json(200, {"action": "terminate", "time": _iso(deadline)})
        if path == AWS_TERMINATION_TIME and preempt:
            return self._send(200, _iso(deadline))
        if path == AWS_REBALANCE and rebalance:
            return self._json(200, {"noticeTime": _iso(rebalance_at)})
        if path == AWS_INSTANCE_ID and instance_id:
            return self._send(200, instance_id)
        self._send(404, "Not Found", "text/html")

    # --- gcp ------------------------------------------------------------------
    def _gcp_get(self, path: str, query: dict) -> None:
        headers = {"Metadata-Flavor": "Google"}
        if self.headers.get("Metadata-Flavor") != "Google" or self.headers.get("X-Forwarded-For"):
            return self._send(403, "Missing Metadata-Flavor:Google header.", "text/html", headers)
        st = self.srv.state
        if path == GCP_INSTANCE_ID and st.instance_id:
            return self._send(200, st.instance_id, headers=headers)
        if path == GCP_NAME and st.name:
            return self._send(200, st.name, headers=headers)
        if path == GCP_ZONE and st.zone:
            return self._send(200, f"projects/{GCP_PROJECT_NUMBER}/zones/{st.zone}", headers=headers)
        if path != GCP_PREEMPTED:
            return self._send(404, "Not Found", "text/html", headers)
        value = self._gcp_wait(query) if query.get("wait_for_change", "").lower() == "true" else self._gcp_value()
        headers["ETag"] = _etag(value)
        self._send(200, value, "application/text", headers)

    def _gcp_value(self) -> str:
        with self.srv.state.cond:
            return "TRUE" if self.srv.state.preempt_visible(time.time()) else "FALSE"

    def _gcp_wait(self, query: dict) -> str:
        """Block until the value's ETag differs from `last_etag` (or the current
        value, when none is given) or `timeout_sec` passes; then answer the value."""
        try:
            timeout = float(query.get("timeout_sec", GCP_DEFAULT_WAIT_S))
        except ValueError:
            timeout = GCP_DEFAULT_WAIT_S
        st = self.srv.state
        end = time.monotonic() + max(0.0, timeout)
        with st.cond:
            start_etag = query.get("last_etag") or _etag(self._value_locked())
            while _etag(self._value_locked()) == start_etag:
                left = end - time.monotonic()
                if left <= 0:
                    break
                st.cond.wait(min(left, 0.5))
            return self._value_locked()

    def _value_locked(self) -> str:
        return "TRUE" if self.srv.state.preempt_visible(time.time()) else "FALSE"

    # --- azure ----------------------------------------------------------------
    def _azure_check(self, query: dict) -> str:
        if self.headers.get("Metadata", "").lower() != "true":
            return "Required metadata header not specified"
        if not query.get("api-version"):
            return "Required querystring parameter api-version not specified"
        return ""

    def _azure_get(self, path: str, query: dict) -> None:
        error = self._azure_check(query)
        if error:
            return self._json(400, {"error": "Bad request", "message": error})
        st = self.srv.state
        if path == AZURE_INSTANCE_ID and st.instance_id:
            return self._send(200, st.instance_id)
        if path == AZURE_NAME and st.name:
            return self._send(200, st.name)
        if path != AZURE_EVENTS:
            return self._json(404, {"error": "Not found"})
        with st.cond:
            now = time.time()
            mine = [(st.event_id, st.name, st.preempt_at, st.deadline)] if st.preempt_visible(now) else []
            events = [_azure_preempt(event_id, vm, deadline, event_id in st.acknowledged)
                      for event_id, vm, visible_at, deadline in mine + st.neighbour_events if now >= visible_at]
            incarnation = len(events) + len(st.acknowledged)
        self._json(200, {"DocumentIncarnation": incarnation, "Events": events})

    def _azure_ack(self, query: dict, body: bytes) -> None:
        error = self._azure_check(query)
        if error:
            return self._json(400, {"error": "Bad request", "message": error})
        try:
            requests_ = json.loads(body)["StartRequests"]
            ids = [r["EventId"] for r in requests_]
        except (ValueError, KeyError, TypeError):
            return self._json(400, {"error": "Bad request", "message": "expected {\"StartRequests\": [{\"EventId\": ...}]}"})
        st = self.srv.state
        with st.cond:
            st.acknowledged.extend(i for i in ids if i not in st.acknowledged)
            st.cond.notify_all()
        self._send(200, "")


def _azure_preempt(event_id: str, vm: str, deadline: float, started: bool) -> dict:
    return {
        "EventId": event_id,
        "EventType": "Preempt",
        "ResourceType": "VirtualMachine",
        "Resources": [vm],
        "EventStatus": "Started" if started else "Scheduled",
        "NotBefore": "" if started else _rfc1123(deadline),
        "Description": "Virtual machine is being preempted.",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


def _etag(value: str) -> str:
    return hashlib.sha1(value.encode()).hexdigest()[:16]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m respawn.metadata_server", description=__doc__.splitlines()[0])
    parser.add_argument("--flavour", choices=FLAVOURS, required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--url-file", help="write the served base URL here once listening")
    args = parser.parse_args(argv)
    server = MetadataServer(args.flavour, port=args.port).start()
    if args.url_file:
        with open(args.url_file, "w") as f:
            f.write(server.url)
    print(server.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
