"""An emulator of the few Compute Engine REST endpoints GcpProvider calls.

Serves the real wire shapes (camelCase JSON, zonal operations, aggregated list
with a label filter) on http://127.0.0.1:<free port>, so the real
google-cloud-compute client talks to it. From the test's side: `fail_next_insert`
(a stock-out, a quota error...), `preempt` (what a spot preemption does), and
`instances` / `received` to see what was launched and sent.

    with GcpComputeEmulator() as gce:
        client_options = {"api_endpoint": gce.endpoint}
"""

from __future__ import annotations

import itertools
import re
import uuid
from dataclasses import dataclass

from tests.emulators.json_http import JsonHttpEmulator

ZONE_PATH = r"/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)"
LABEL_TERM = re.compile(r'labels\.(?P<key>[a-z0-9_-]+)\s*(?::\s*\*|=\s*"?(?P<value>[^"\s)]*)"?)')


@dataclass
class Failure:
    code: str
    http_status: int
    message: str
    at_request: bool  # answered on the insert call itself rather than in its operation


class GcpComputeEmulator(JsonHttpEmulator):
    def __init__(self):
        super().__init__()
        self.instances: dict[tuple[str, str], dict] = {}  # (zone, name) -> instance resource
        self.preempted: list[tuple[str, str]] = []
        self._operations: dict[str, dict] = {}
        self._ops_by_request_id: dict[str, dict] = {}
        self._pending_effects: dict[str, tuple] = {}
        self._failures: list[Failure] = []
        self._ids = itertools.count(1000)
        self.route("POST", ZONE_PATH + r"/instances", self._insert)
        self.route("GET", ZONE_PATH + r"/instances", self._list_zone)
        self.route("GET", ZONE_PATH + r"/instances/(?P<name>[^/]+)", self._get)
        self.route("DELETE", ZONE_PATH + r"/instances/(?P<name>[^/]+)", self._delete)
        self.route("GET", r"/compute/v1/projects/(?P<project>[^/]+)/aggregated/instances", self._aggregated)
        self.route("GET", ZONE_PATH + r"/operations/(?P<op>[^/]+)", self._operation)
        self.route("POST", ZONE_PATH + r"/operations/(?P<op>[^/]+)/wait", self._operation)
        self.route("POST", ZONE_PATH + r"/instances/(?P<name>[^/]+)/simulateMaintenanceEvent", self._maintenance)
        self.maintenance_events: list[tuple[str, str]] = []
        self._denied: set[str] = set()

    # --- the test's side ---

    def fail_next_insert(self, code: str, *, http_status: int = 503, message: str = "", at_request: bool = False) -> None:
        """Make the next insert fail: in its operation (how stock-outs and quota
        errors arrive) or, with `at_request`, as the HTTP answer to the insert."""
        with self.lock:
            self._failures.append(Failure(code, http_status, message or f"emulated {code}", at_request))

    def preempt(self, zone: str, name: str) -> None:
        """A spot preemption: DELETE-action VMs vanish, STOP-action VMs become TERMINATED."""
        with self.lock:
            vm = self.instances[(zone, name)]
            self.preempted.append((zone, name))
            if vm.get("scheduling", {}).get("instanceTerminationAction") == "STOP":
                vm["status"] = "TERMINATED"
            else:
                del self.instances[(zone, name)]

    def deny(self, permission: str) -> None:
        """Answer the call needing `permission` (e.g. "compute.instances.simulateMaintenanceEvent")
        403 forbidden, as Compute does for a caller whose roles lack it."""
        with self.lock:
            self._denied.add(permission)

    def startup_script(self, zone: str, name: str) -> str:
        """The boot script a launched VM would run (to run it locally, as the VM would)."""
        items = self.instances[(zone, name)]["metadata"]["items"]
        return next(item["value"] for item in items if item["key"] == "startup-script")

    def insert_bodies(self) -> list[tuple[dict[str, str], dict]]:
        """(query, body) of every insert received, in order."""
        return [(r.query, r.body) for r in self.requests_to("POST", "/instances") if not r.path.endswith("/wait")]

    # --- the REST endpoints ---

    def _insert(self, m, query, body):
        zone, project = m["zone"], m["project"]
        request_id = query.get("requestId")
        if request_id is not None and not _is_request_id(request_id):
            return _error(400, "invalid", f"Invalid value for field 'requestId': '{request_id}'. The request id must be a valid UUID.")
        if request_id in self._ops_by_request_id:  # Compute dedups a retried request id
            return 200, self._ops_by_request_id[request_id], {}
        name = body["name"]
        if (zone, name) in self.instances:
            resource = f"projects/{project}/zones/{zone}/instances/{name}"
            return _error(409, "alreadyExists", f"The resource '{resource}' already exists")
        failure = self._failures.pop(0) if self._failures else None
        if failure and failure.at_request:
            return _error(failure.http_status, failure.code, failure.message)
        op = self._new_operation(project, zone, "insert", name)
        if failure:
            self._pending_effects[op["name"]] = ("fail", failure)
        else:
            vm = {
                **body,
                "id": str(next(self._ids)),
                "kind": "compute#instance",
                "status": "PROVISIONING",
                "zone": _zone_url(self.endpoint, project, zone),
                "selfLink": f"{_zone_url(self.endpoint, project, zone)}/instances/{name}",
            }
            self.instances[(zone, name)] = vm
            self._pending_effects[op["name"]] = ("run", (zone, name))
        if request_id:
            self._ops_by_request_id[request_id] = op
        return 200, op, {}

    def _get(self, m, query, body):
        vm = self.instances.get((m["zone"], m["name"]))
        return (200, vm, {}) if vm else _not_found(m)

    def _maintenance(self, m, query, body):
        """A simulated host maintenance: a Spot VM is preempted by it (its ACPI notice is the
        metadata emulator's business); a standard VM migrates, which changes nothing here."""
        if "compute.instances.simulateMaintenanceEvent" in self._denied:
            return _forbidden("compute.instances.simulateMaintenanceEvent", m)
        vm = self.instances.get((m["zone"], m["name"]))
        if vm is None:
            return _not_found(m)
        self.maintenance_events.append((m["zone"], m["name"]))
        if vm.get("scheduling", {}).get("provisioningModel") == "SPOT":
            self.preempt(m["zone"], m["name"])
        op = self._new_operation(m["project"], m["zone"], "simulateMaintenanceEvent", m["name"])
        op["status"] = "DONE"
        return 200, op, {}

    def _delete(self, m, query, body):
        if "compute.instances.delete" in self._denied:
            return _forbidden("compute.instances.delete", m)
        if self.instances.pop((m["zone"], m["name"]), None) is None:
            return _not_found(m)
        op = self._new_operation(m["project"], m["zone"], "delete", m["name"])
        op["status"] = "DONE"
        return 200, op, {}

    def _list_zone(self, m, query, body):
        found = [vm for (zone, _), vm in self.instances.items() if zone == m["zone"] and _matches(vm, query.get("filter", ""))]
        return 200, {"kind": "compute#instanceList", "items": found}, {}

    def _aggregated(self, m, query, body):
        found = [(zone, vm) for (zone, _), vm in sorted(self.instances.items()) if _matches(vm, query.get("filter", ""))]
        start = int(query.get("pageToken") or 0)
        size = int(query.get("maxResults") or 500)
        items: dict[str, dict] = {}
        for zone, vm in found[start : start + size]:
            items.setdefault(f"zones/{zone}", {"instances": []})["instances"].append(vm)
        answer = {"kind": "compute#instanceAggregatedList", "items": items}
        if start + size < len(found):
            answer["nextPageToken"] = str(start + size)
        return 200, answer, {}

    def _operation(self, m, query, body):
        op = self._operations.get(m["op"])
        if op is None:
            return _not_found(m)
        self._complete(op)
        return 200, op, {}

    def _new_operation(self, project: str, zone: str, kind: str, name: str) -> dict:
        op_name = f"operation-{next(self._ids)}"
        op = {
            "kind": "compute#operation",
            "id": op_name.split("-")[1],
            "name": op_name,
            "operationType": kind,
            "status": "RUNNING",
            "zone": _zone_url(self.endpoint, project, zone),
            "targetLink": f"{_zone_url(self.endpoint, project, zone)}/instances/{name}",
            "selfLink": f"{_zone_url(self.endpoint, project, zone)}/operations/{op_name}",
        }
        self._operations[op_name] = op
        return op

    def _complete(self, op: dict) -> None:
        effect = self._pending_effects.pop(op["name"], None)
        op["status"] = "DONE"
        if effect is None:
            return
        kind, detail = effect
        if kind == "run" and detail in self.instances:
            self.instances[detail]["status"] = "RUNNING"
        elif kind == "fail":
            op["httpErrorStatusCode"] = detail.http_status
            op["httpErrorMessage"] = detail.message
            op["error"] = {"errors": [{"code": detail.code, "message": detail.message}]}


def _is_request_id(value: str) -> bool:
    """Compute accepts any UUID but the zero one."""
    try:
        return uuid.UUID(value).int != 0
    except ValueError:
        return False


def _zone_url(endpoint: str, project: str, zone: str) -> str:
    return f"{endpoint}/compute/v1/projects/{project}/zones/{zone}"


def _matches(vm: dict, filter_expression: str) -> bool:
    labels = vm.get("labels", {})
    for term in LABEL_TERM.finditer(filter_expression):
        if term["key"] not in labels or (term["value"] is not None and labels[term["key"]] != term["value"]):
            return False
    return True


def _error(status: int, reason: str, message: str):
    return status, {"error": {"code": status, "message": message, "errors": [{"reason": reason, "message": message}]}}, {}


def _forbidden(permission: str, m):
    return _error(403, "forbidden", f"Required '{permission}' permission for '{m.string}'")


def _not_found(m):
    return _error(404, "notFound", f"The resource '{m.string}' was not found")
