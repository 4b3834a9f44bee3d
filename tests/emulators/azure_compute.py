"""An emulator of the Azure Resource Manager endpoints AzureProvider calls for VMs.

HTTPS on 127.0.0.1:<free port> with a throwaway self-signed certificate made at
start (the SDK refuses bearer tokens over plain http); `cert_path` is the PEM to
pass as `connection_verify`. Creates, starts and deletes answer like ARM: 201/202
with an `Azure-AsyncOperation` URL whose status goes InProgress, then Succeeded
or Failed. From the test's side: `fail_next_create` (allocation failure, quota...),
`evict` (what a spot eviction does, by the VM's eviction policy), and `vms` /
`received` to see what was created and sent.

    with AzureComputeEmulator() as arm:
        ComputeManagementClient(cred, SUB, base_url=arm.endpoint, connection_verify=arm.cert_path)
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import itertools
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.emulators.json_http import JsonHttpEmulator

VM_PATH = (
    r"/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)"
    r"/providers/Microsoft\.Compute/virtualMachines"
)


@dataclass
class Failure:
    code: str
    message: str
    http_status: int
    at_request: bool  # answered on the PUT itself rather than in its async operation


class AzureComputeEmulator(JsonHttpEmulator):
    def __init__(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="azure-emulator-")
        self.cert_path = str(Path(self._tmp.name) / "cert.pem")
        super().__init__(ssl_context=_self_signed_context(Path(self._tmp.name)))
        self.vms: dict[str, dict] = {}  # name -> VM resource as ARM would return it
        self.power: dict[str, str] = {}  # name -> "running" | "deallocated" | ...
        self.evicted: list[str] = []
        self._operations: dict[str, dict] = {}
        self._failures: list[Failure] = []
        self._ids = itertools.count(1)
        self.route("PUT", VM_PATH + r"/(?P<name>[^/]+)", self._put)
        self.route("GET", VM_PATH + r"/(?P<name>[^/]+)", self._get)
        self.route("GET", VM_PATH + r"/(?P<name>[^/]+)/instanceView", self._instance_view)
        self.route("DELETE", VM_PATH + r"/(?P<name>[^/]+)", self._delete)
        self.route("POST", VM_PATH + r"/(?P<name>[^/]+)/start", self._start)
        self.route("POST", VM_PATH + r"/(?P<name>[^/]+)/simulateEviction", self._simulate_eviction)
        self.route("GET", VM_PATH, self._list)
        self.deletes: list[tuple[str, dict[str, str]]] = []  # (name, query) of every DELETE
        self._denied: set[str] = set()
        self.route("GET", r"/subscriptions/(?P<sub>[^/]+)/providers/Microsoft\.Compute/locations/[^/]+/operations/(?P<op>[^/]+)", self._operation)

    def stop(self) -> None:
        super().stop()
        self._tmp.cleanup()

    # --- the test's side ---

    def fail_next_create(self, code: str, *, message: str = "", http_status: int = 409, at_request: bool = False) -> None:
        """Make the next VM create fail: in its async operation (how allocation
        failures arrive) or, with `at_request`, as the answer to the PUT."""
        with self.lock:
            self._failures.append(Failure(code, message or f"emulated {code}", http_status, at_request))

    def evict(self, name: str) -> None:
        """A spot eviction: evictionPolicy Delete removes the VM, Deallocate stops it."""
        with self.lock:
            self.evicted.append(name)
            if self.vms[name]["properties"].get("evictionPolicy") == "Deallocate":
                self.power[name] = "deallocated"
            else:
                del self.vms[name]
                self.power.pop(name, None)

    def deny(self, action: str) -> None:
        """Answer the call needing `action` (e.g. "Microsoft.Compute/virtualMachines/simulateEviction/action")
        403 AuthorizationFailed, as ARM does for a caller whose role lacks it."""
        with self.lock:
            self._denied.add(action)

    def custom_data(self, name: str) -> str:
        """The boot script a created VM would run (to run it locally, as the VM would)."""
        return base64.b64decode(self.vms[name]["properties"]["osProfile"]["customData"]).decode()

    def create_bodies(self) -> list[tuple[dict[str, str], dict]]:
        """(query, body) of every VM PUT received, in order."""
        return [(r.query, r.body) for r in self.received if r.method == "PUT"]

    # --- the ARM endpoints ---

    def _put(self, m, query, body):
        name = m["name"]
        failure = self._failures.pop(0) if self._failures else None
        if failure and failure.at_request:
            return _error(failure.http_status, failure.code, failure.message)
        created = name not in self.vms
        vm = {
            **body,
            "id": m.string,
            "name": name,
            "type": "Microsoft.Compute/virtualMachines",
            "properties": {**body.get("properties", {}), "provisioningState": "Creating", "vmId": f"vm-{next(self._ids)}"},
        }
        self.vms[name] = vm
        self.power[name] = "starting"
        op_url = self._new_operation(name, "create", failure)
        return (201 if created else 200), vm, {"Azure-AsyncOperation": op_url}

    def _get(self, m, query, body):
        vm = self.vms.get(m["name"])
        if vm is None:
            return _not_found(m["name"])
        if query.get("$expand") == "instanceView":
            vm = {**vm, "properties": {**vm["properties"], "instanceView": self._view(m["name"])}}
        return 200, vm, {}

    def _instance_view(self, m, query, body):
        return (200, self._view(m["name"]), {}) if m["name"] in self.vms else _not_found(m["name"])

    def _simulate_eviction(self, m, query, body):
        """ARM accepts (204) and evicts the Spot VM by its policy (after its Preempt event,
        which is the metadata emulator's business)."""
        action = "Microsoft.Compute/virtualMachines/simulateEviction/action"
        if action in self._denied:
            return _authorization_failed(action, m)
        if m["name"] not in self.vms:
            return _not_found(m["name"])
        if self.vms[m["name"]]["properties"].get("priority") != "Spot":
            return _error(409, "OperationNotAllowed", "Simulate eviction is only supported for Spot VMs.")
        self.evict(m["name"])
        return 204, None, {}

    def _delete(self, m, query, body):
        if "Microsoft.Compute/virtualMachines/delete" in self._denied:
            return _authorization_failed("Microsoft.Compute/virtualMachines/delete", m)
        self.deletes.append((m["name"], query))
        if m["name"] not in self.vms:
            return 204, None, {}
        self.vms[m["name"]]["properties"]["provisioningState"] = "Deleting"
        return 202, None, {"Azure-AsyncOperation": self._new_operation(m["name"], "delete", None)}

    def _start(self, m, query, body):
        if m["name"] not in self.vms:
            return _not_found(m["name"])
        self.power[m["name"]] = "starting"
        return 202, None, {"Azure-AsyncOperation": self._new_operation(m["name"], "start", None)}

    def _list(self, m, query, body):
        return 200, {"value": list(self.vms.values())}, {}

    def _operation(self, m, query, body):
        op = self._operations.get(m["op"])
        if op is None:
            return _not_found(m["op"])
        if op["polls"] == 0:  # one InProgress answer first, as ARM gives while it works
            op["polls"] += 1
            return 200, {"status": "InProgress"}, {}
        self._finish(op)
        answer = {"status": op["status"]}
        if op["failure"]:
            answer["error"] = {"code": op["failure"].code, "message": op["failure"].message}
        return 200, answer, {}

    def _new_operation(self, name: str, kind: str, failure: Failure | None) -> str:
        op_id = f"op-{next(self._ids)}"
        self._operations[op_id] = {"name": name, "kind": kind, "failure": failure, "polls": 0, "status": "InProgress"}
        location = self.vms[name].get("location", "eastus")
        return f"{self.endpoint}/subscriptions/sub/providers/Microsoft.Compute/locations/{location}/operations/{op_id}?api-version=2024-07-01"

    def _finish(self, op: dict) -> None:
        if op["status"] != "InProgress":
            return
        name = op["name"]
        op["status"] = "Failed" if op["failure"] else "Succeeded"
        if name not in self.vms:
            return
        if op["kind"] == "delete":
            del self.vms[name]
            self.power.pop(name, None)
        elif op["failure"]:
            self.vms[name]["properties"]["provisioningState"] = "Failed"  # ARM keeps the failed VM
            self.power.pop(name, None)
        else:
            self.vms[name]["properties"]["provisioningState"] = "Succeeded"
            self.power[name] = "running"

    def _view(self, name: str) -> dict:
        statuses = [{"code": f"ProvisioningState/{self.vms[name]['properties']['provisioningState'].lower()}"}]
        if name in self.power:
            statuses.append({"code": f"PowerState/{self.power[name]}"})
        return {"statuses": statuses}


def _error(status: int, code: str, message: str):
    return status, {"error": {"code": code, "message": message}}, {}


def _authorization_failed(action: str, m):
    return _error(403, "AuthorizationFailed", f"The client 'respawn' does not have authorization to perform action "
                                              f"'{action}' over scope '{m.string}' or the scope is invalid.")


def _not_found(name: str):
    return _error(404, "ResourceNotFound", f"The Resource '{name}' was not found.")


def _self_signed_context(directory: Path) -> ssl.SSLContext:
    """A server context with a fresh key and a certificate for IP 127.0.0.1, its PEM
    written to directory/cert.pem for the client to trust."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    return context


class ManagedIdentityEndpoint(JsonHttpEmulator):
    """The token endpoint of an Azure managed identity (App Service flavour), over
    plain http as on a host: a process given `env` gets ARM tokens from it through
    azure-identity's own DefaultAzureCredential, with no credential in our config."""

    SECRET = "emulator-identity-header"

    def __init__(self):
        super().__init__()
        self.route("GET", r"/msi/token", self._token)

    @property
    def env(self) -> dict[str, str]:
        return {"IDENTITY_ENDPOINT": f"{self.endpoint}/msi/token", "IDENTITY_HEADER": self.SECRET}

    def _token(self, m, query, body):
        if self.received[-1].headers.get("X-IDENTITY-HEADER") != self.SECRET:
            return _error(401, "Unauthorized", "missing or wrong X-IDENTITY-HEADER")
        expires = int(dt.datetime.now(dt.UTC).timestamp()) + 3600
        return 200, {"access_token": "emulator-token", "expires_on": str(expires), "resource": query.get("resource", ""),
                     "token_type": "Bearer"}, {}
