"""Google Compute Engine through google-cloud-compute: one provider object serves
one project, in any of its zones.

The VM's name is made from our instance id, so a retried insert either hits the
request id Compute deduplicates or conflicts with the VM the first try made;
both end with that one VM. Operations are polled with our own
ZoneOperationsClient: the one the SDK builds for extended operations ignores the
endpoint we configured.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from respawn_server.jobs.core.choices import Market
from respawn_server.jobs.fleet.providers.base import (LABEL_INSTANCE, LABEL_JOB, CloudInstance, CloudState, LaunchRequest,
                                       PrecheckError, Provider, TransientError)
from respawn_server.jobs.fleet.providers.errors import ErrorCodes, naming_permission
from respawn_server.jobs.fleet.providers.tags import ids_from_tags

ERROR_CODES = ErrorCodes(
    transient=frozenset({"rateLimitExceeded", "userRateLimitExceeded", "backendError", "internalError", "resourceNotReady"}),
    capacity=frozenset(
        {
            "ZONE_RESOURCE_POOL_EXHAUSTED",
            "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
            "STOCKOUT",
            "resourcePoolExhausted",
            "UNSUPPORTED_OPERATION",  # e.g. this machine type or spot not offered in this zone
        }
    ),
    precheck=frozenset({"QUOTA_EXCEEDED", "quotaExceeded", "forbidden", "accessNotConfigured", "PERMISSIONS_ERROR", "invalid"}),
)

# What Compute answers a caller without the IAM permission a call needs.
ACCESS_DENIED = ("forbidden", "PERMISSIONS_ERROR", "insufficientPermissions", "PERMISSION_DENIED")

STATE_MAP = {
    "PROVISIONING": CloudState.PENDING,
    "STAGING": CloudState.PENDING,
    "REPAIRING": CloudState.PENDING,
    "RUNNING": CloudState.RUNNING,
    "STOPPING": CloudState.STOPPED,
    "SUSPENDING": CloudState.STOPPED,
    "SUSPENDED": CloudState.STOPPED,
    "TERMINATED": CloudState.STOPPED,  # Compute's word for a stopped VM that can start again
}


@dataclass(frozen=True, kw_only=True, slots=True)
class GcpConfig:
    project: str
    """The project VMs are launched in and listed from."""
    api_endpoint: str | None = None
    """Compute REST endpoint override (e.g. an emulator); None for compute.googleapis.com."""
    credentials: Any = None
    """google.auth credentials; None: Application Default Credentials."""
    image: str = "projects/debian-cloud/global/images/family/debian-12"
    """Boot image used when a launch request names none."""
    service_account: str = ""
    """E-mail of the service account VMs run as: the identity the Google SDKs on the VM take
    from the metadata server, to read and write the job's gs:// checkpoints with no key in
    the job's env (docs/deploy.md gives the smallest role). Empty: VMs run with none."""
    scopes: tuple[str, ...] = ("https://www.googleapis.com/auth/cloud-platform",)
    """OAuth scopes of the VMs' service account; IAM roles do the narrowing (Google's advice)."""
    network: str = "global/networks/default"
    disk_size_gb: int = 50
    name_prefix: str = "respawn"
    """VM names are `<prefix>-<instance id>`: lowercase letters, digits and '-'."""
    poll_interval_s: float = 2.0
    """Pause between operation polls (each poll is itself a server-side wait)."""
    operation_timeout_s: float = 600.0
    list_page_size: int = 500
    """VMs per aggregated-list page when listing ours (Compute allows up to 500)."""

    def __post_init__(self) -> None:
        if not self.project:
            raise ValueError("GcpConfig.project is required (the GCP project id)")
        if not re.fullmatch(r"[a-z][a-z0-9-]*", self.name_prefix):
            raise ValueError(f"GcpConfig.name_prefix must start with a lowercase letter and hold only a-z, 0-9 and '-', got {self.name_prefix!r}")
        if self.poll_interval_s < 0 or self.operation_timeout_s <= 0:
            raise ValueError("GcpConfig.poll_interval_s must be >= 0 and operation_timeout_s > 0")
        if not 1 <= self.list_page_size <= 500:
            raise ValueError(f"GcpConfig.list_page_size must be within 1..500 (Compute's limits), got {self.list_page_size}")
        object.__setattr__(self, "scopes", tuple(self.scopes))  # a JSON list from the settings
        if self.service_account and not re.fullmatch(r"[^@\s]+@[^@\s]+", self.service_account):
            raise ValueError(f"GcpConfig.service_account must be a service account's e-mail, got "
                             f"{self.service_account!r}")
        if self.service_account and not self.scopes:
            raise ValueError("GcpConfig.scopes must name at least one scope, e.g. "
                             "https://www.googleapis.com/auth/cloud-platform")
        if self.disk_size_gb < 10:
            raise ValueError(f"GcpConfig.disk_size_gb must be at least 10 (Compute's minimum), got {self.disk_size_gb}")


def vm_id(zone: str, name: str) -> str:
    """Our provider instance id for a Compute VM: names are only unique per zone."""
    return f"{zone}/{name}"


def split_vm_id(provider_instance_id: str) -> tuple[str, str]:
    zone, sep, name = provider_instance_id.partition("/")
    if not sep or not zone or not name:
        raise ValueError(f"not a GCP provider instance id ('<zone>/<name>'): {provider_instance_id!r}")
    return zone, name


class GcpProvider(Provider):
    name = "gcp"

    def __init__(self, config: GcpConfig):
        from google.cloud import compute_v1  # ~3 s to import: only when a GCP provider is made

        self.config = config
        self._compute = compute_v1
        client_options = {"api_endpoint": config.api_endpoint} if config.api_endpoint else None
        common = {"credentials": config.credentials, "transport": "rest", "client_options": client_options}
        self._instances = compute_v1.InstancesClient(**common)
        self._operations = compute_v1.ZoneOperationsClient(**common)

    def vm_name(self, instance_id: int) -> str:
        return f"{self.config.name_prefix}-{instance_id}"

    def launch(self, request: LaunchRequest) -> str:
        zone = request.placement.zone
        if not zone:
            raise ValueError("a GCP placement needs a zone: Compute VMs are zonal")
        name = self.vm_name(request.instance_id)
        insert = self._compute.InsertInstanceRequest(
            project=self.config.project,
            zone=zone,
            instance_resource=self._instance_resource(request, name),
            request_id=request.client_token,
        )
        try:
            with translated_errors():
                operation = self._instances.insert_unary(request=insert)
        except PrecheckError as exc:
            if exc.code != "alreadyExists":
                raise
            return vm_id(zone, name)
        self._wait(zone, operation)
        return vm_id(zone, name)

    def _instance_resource(self, request: LaunchRequest, name: str):
        c = self._compute
        placement = request.placement
        spot = placement.market == Market.SPOT
        # Compute has no spot price cap: max_price_per_hour is not sent (the ledger prices it).
        scheduling = (
            c.Scheduling(provisioning_model="SPOT", instance_termination_action="DELETE", automatic_restart=False, on_host_maintenance="TERMINATE")
            if spot
            else c.Scheduling(provisioning_model="STANDARD")
        )
        return c.Instance(
            name=name,
            machine_type=f"zones/{placement.zone}/machineTypes/{placement.instance_type}",
            labels={**request.extra_tags, LABEL_JOB: str(request.job_id), LABEL_INSTANCE: str(request.instance_id)},
            metadata=c.Metadata(items=[c.Items(key="startup-script", value=request.user_data)]),
            scheduling=scheduling,
            disks=[
                c.AttachedDisk(
                    boot=True,
                    auto_delete=True,
                    initialize_params=c.AttachedDiskInitializeParams(
                        source_image=request.machine_image or self.config.image, disk_size_gb=self.config.disk_size_gb
                    ),
                )
            ],
            service_accounts=[c.ServiceAccount(email=self.config.service_account, scopes=list(self.config.scopes))]
            if self.config.service_account else [],
            network_interfaces=[
                c.NetworkInterface(
                    network=self.config.network,
                    access_configs=[c.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")],
                )
            ],
        )

    def _wait(self, zone: str, operation) -> None:
        """Poll until the operation is DONE; raise its error, classified, if it failed."""
        deadline = time.monotonic() + self.config.operation_timeout_s
        done = self._compute.Operation.Status.DONE
        while operation.status != done:
            if time.monotonic() > deadline:
                raise TransientError(f"operation {operation.name} in {zone} not done after {self.config.operation_timeout_s:.0f} s")
            with translated_errors():
                operation = self._operations.wait(project=self.config.project, zone=zone, operation=operation.name)
            if operation.status != done:
                time.sleep(self.config.poll_interval_s)
        if operation.error.errors:
            first = operation.error.errors[0]
            raise ERROR_CODES.classify(first.code, first.message, http_status=operation.http_error_status_code or None)

    def terminate(self, provider_instance_id: str) -> None:
        zone, name = split_vm_id(provider_instance_id)
        try:
            with translated_errors():
                # Not waited for: the delete is accepted, and reconcile re-checks what is still listed.
                self._instances.delete_unary(project=self.config.project, zone=zone, instance=name)
        except PrecheckError as exc:
            if exc.code != "notFound":
                raise

    def interrupt(self, provider_instance_id: str, *, with_notice: bool) -> str:
        """With a notice: Compute's simulated host maintenance, which preempts a Spot VM as a
        reclaim does (ACPI shutdown, `preempted` TRUE in the metadata). Without: the VM
        deleted at once (no maintenance notice comes first)."""
        zone, name = split_vm_id(provider_instance_id)
        if with_notice:
            permission, call = "compute.instances.simulateMaintenanceEvent", self._instances.simulate_maintenance_event_unary
        else:
            permission, call = "compute.instances.delete", self._instances.delete_unary
        with naming_permission(permission, ACCESS_DENIED):
            with translated_errors():
                operation = call(project=self.config.project, zone=zone, instance=name)
            self._wait(zone, operation)
        return f"operation {operation.name} ({'simulateMaintenanceEvent' if with_notice else 'delete'})"

    def describe(self, provider_instance_id: str) -> CloudInstance:
        zone, name = split_vm_id(provider_instance_id)
        try:
            with translated_errors():
                vm = self._instances.get(project=self.config.project, zone=zone, instance=name)
        except PrecheckError as exc:
            if exc.code != "notFound":
                raise
            return CloudInstance(provider_instance_id=provider_instance_id, state=CloudState.GONE, zone=zone)
        return _cloud_instance(zone, vm)

    def list_ours(self) -> list[CloudInstance]:
        return self._list(f"labels.{LABEL_INSTANCE}:*")

    def find_by_instance_id(self, instance_id: int) -> CloudInstance | None:
        found = self._list(f'labels.{LABEL_INSTANCE} = "{instance_id}"')
        return found[0] if found else None

    def _list(self, label_filter: str) -> list[CloudInstance]:
        request = self._compute.AggregatedListInstancesRequest(
            project=self.config.project, filter=label_filter, max_results=self.config.list_page_size
        )
        with translated_errors():
            return [
                _cloud_instance(scope.rpartition("/")[2], vm)
                for scope, scoped in self._instances.aggregated_list(request=request)
                for vm in scoped.instances
            ]


@contextmanager
def translated_errors() -> Iterator[None]:
    """Re-raise google-api-core errors as our ProviderError kinds, keeping the cloud's message."""
    from google.api_core import exceptions as gexc
    from google.auth.exceptions import RefreshError
    from requests import RequestException

    try:
        yield
    except gexc.GoogleAPICallError as exc:
        reasons = [e.get("reason", "") for e in exc.errors or [] if isinstance(e, dict)]
        code = next(filter(None, reasons), "") or (exc.reason or "")
        raise ERROR_CODES.classify(code, exc.message, http_status=exc.code) from exc
    except (RequestException, gexc.RetryError) as exc:
        raise TransientError(f"Compute API unreachable: {exc}") from exc
    except RefreshError as exc:
        raise PrecheckError(f"GCP credentials refused: {exc}", code="RefreshError") from exc


def _cloud_instance(zone: str, vm) -> CloudInstance:
    job_id, instance_id = ids_from_tags(vm.labels, job_key=LABEL_JOB, instance_key=LABEL_INSTANCE)
    return CloudInstance(
        provider_instance_id=vm_id(zone, vm.name),
        state=STATE_MAP.get(vm.status, CloudState.PENDING),
        zone=zone,
        instance_type=vm.machine_type.rpartition("/")[2],
        job_id=job_id,
        instance_id=instance_id,
    )
