"""Azure VMs through azure-mgmt-compute: one provider object serves one resource
group of one subscription, in any region (the placement's).

A VM is named from our instance id, and ARM's PUT is itself idempotent, so a
repeated launch meets the VM the first made. With eviction policy Deallocate an
evicted VM stays, stopped, with its disk (still billed): launching that instance
again starts it rather than creating another.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from respawn_server.jobs.core.choices import Market
from respawn_server.jobs.fleet.providers.base import (TAG_INSTANCE, TAG_JOB, CapacityError, CloudInstance, CloudState, LaunchRequest,
                                       PrecheckError, Provider, TransientError)
from respawn_server.jobs.fleet.providers.errors import ErrorCodes, naming_permission
from respawn_server.jobs.fleet.providers.tags import ids_from_tags

ERROR_CODES = ErrorCodes(
    transient=frozenset({"TooManyRequests", "InternalServerError", "InternalExecutionError"}),
    capacity=frozenset(
        {
            "AllocationFailed",
            "ZonalAllocationFailed",
            "SkuNotAvailable",
            "OverconstrainedAllocationRequest",
            "OverconstrainedZonalAllocationRequest",
        }
    ),
    precheck=frozenset(
        {
            "QuotaExceeded",
            "OperationNotAllowed",  # what ARM answers when a core quota would be exceeded
            "AuthorizationFailed",
            "AuthenticationFailed",
            "InvalidAuthenticationToken",
            "InvalidParameter",
            "PlatformImageNotFound",
            "ImageNotFound",
            "SubscriptionNotRegistered",
        }
    ),
)

EVICTION_POLICIES = ("Delete", "Deallocate")
# What ARM answers a caller whose role lacks the action a call needs (403).
ACCESS_DENIED = ("AuthorizationFailed", "LinkedAuthorizationFailed")
DEFAULT_OS_DISK_TIER = "P10"
# Managed disk tiers an OS disk may take: tier -> (storage account type, size in GiB).
# A tier's price is per month whatever of it is used; the Retail Prices API names it
# "<tier> LRS" (skuName), e.g. "P10 LRS".
OS_DISK_TIERS = {
    **{f"P{n}": ("Premium_LRS", gib) for n, gib in ((4, 32), (6, 64), (10, 128), (15, 256), (20, 512), (30, 1024))},
    **{f"E{n}": ("StandardSSD_LRS", gib) for n, gib in ((4, 32), (6, 64), (10, 128), (15, 256), (20, 512), (30, 1024))},
    **{f"S{n}": ("Standard_LRS", gib) for n, gib in ((4, 32), (6, 64), (10, 128), (15, 256), (20, 512), (30, 1024))},
}
URN = re.compile(r"[^:]+:[^:]+:[^:]+:[^:]+")
IDENTITY_ID = re.compile(r"/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.ManagedIdentity/"
                         r"userAssignedIdentities/[^/]+", re.IGNORECASE)
POWER_STATES = {
    "starting": CloudState.PENDING,
    "running": CloudState.RUNNING,
    "stopping": CloudState.STOPPED,
    "stopped": CloudState.STOPPED,
    "deallocating": CloudState.STOPPED,
    "deallocated": CloudState.STOPPED,
}


@dataclass(frozen=True, kw_only=True, slots=True)
class AzureConfig:
    subscription_id: str
    resource_group: str
    """VMs are created in and listed from this resource group."""
    subnet_id: str
    """ARM id of the subnet VMs join; it needs outbound access (e.g. a NAT gateway) to reach the control plane."""
    ssh_public_key: str
    """Azure requires a login method for Linux VMs; password login stays off."""
    admin_username: str = "respawn"
    endpoint: str | None = None
    """ARM endpoint override (e.g. an emulator); None for management.azure.com."""
    credential: Any = None
    """An azure.core TokenCredential; None: azure.identity.DefaultAzureCredential."""
    connection_verify: bool | str = True
    """TLS verification: True, or the path of a CA bundle (an emulator's certificate)."""
    image: str = "Canonical:ubuntu-24_04-lts:server:latest"
    """Image URN (publisher:offer:sku:version) used when a launch request names none."""
    managed_identity: str = ""
    """ARM id of a user-assigned managed identity VMs launch with
    (/subscriptions/…/providers/Microsoft.ManagedIdentity/userAssignedIdentities/NAME): what
    DefaultAzureCredential on the VM takes, to read and write the job's az:// checkpoints with
    no key in the job's env (docs/deploy.md gives the smallest role). Empty: none."""
    managed_identity_client_id: str = ""
    """That identity's client id, given to the agent as AZURE_CLIENT_ID: with a user-assigned
    identity DefaultAzureCredential needs to be told which one."""
    storage_account_url: str = ""
    """https://ACCOUNT.blob.core.windows.net, the account of the jobs' az:// checkpoints, given
    to the agent as AZURE_STORAGE_ACCOUNT_URL. Empty: the job's env must say it."""
    eviction_policy: str = "Delete"
    """Delete: an evicted VM is gone. Deallocate: it stays stopped and its disk keeps billing."""
    os_disk_tier: str = DEFAULT_OS_DISK_TIER
    """The OS disk's managed disk tier (a key of OS_DISK_TIERS): P10 is a 128 GiB Premium SSD,
    room for the image, CUDA wheels and the pip cache, on the storage every GPU size
    supports and that boots and installs fastest. With Deallocate it is what a stopped
    VM bills until deleted, priced from the Retail Prices API's "<tier> LRS" meter."""
    polling_interval_s: float = 15.0
    """Pause between polls of a long-running operation (ARM's Retry-After wins when sent)."""
    retry_total: int = 3
    """azure-core's own retries of throttling and 5xx per call."""

    def __post_init__(self) -> None:
        for field_name in ("subscription_id", "resource_group", "subnet_id", "ssh_public_key"):
            if not getattr(self, field_name):
                raise ValueError(f"AzureConfig.{field_name} is required")
        if self.eviction_policy not in EVICTION_POLICIES:
            raise ValueError(f"AzureConfig.eviction_policy must be one of {EVICTION_POLICIES}, got {self.eviction_policy!r}")
        if not URN.fullmatch(self.image):
            raise ValueError(f"AzureConfig.image must be an image URN 'publisher:offer:sku:version', got {self.image!r}")
        if self.os_disk_tier not in OS_DISK_TIERS:
            raise ValueError(f"AzureConfig.os_disk_tier must be one of {', '.join(OS_DISK_TIERS)}, "
                             f"got {self.os_disk_tier!r}")
        if self.managed_identity and not IDENTITY_ID.fullmatch(self.managed_identity):
            raise ValueError("AzureConfig.managed_identity must be a user-assigned identity's ARM id, /subscriptions/"
                             f"…/providers/Microsoft.ManagedIdentity/userAssignedIdentities/NAME, got "
                             f"{self.managed_identity!r}")
        if bool(self.managed_identity) != bool(self.managed_identity_client_id):
            raise ValueError("AzureConfig.managed_identity and managed_identity_client_id go together: the VM's "
                             "DefaultAzureCredential picks a user-assigned identity by its client id")
        if self.polling_interval_s < 0 or self.retry_total < 0:
            raise ValueError("AzureConfig.polling_interval_s and retry_total must not be negative")


@contextmanager
def translated_errors() -> Iterator[None]:
    """Re-raise azure-core errors as our ProviderError kinds, keeping the cloud's message."""
    from azure.core.exceptions import (ClientAuthenticationError, HttpResponseError, ServiceRequestError,
                                       ServiceResponseError)

    try:
        yield
    except HttpResponseError as exc:
        code = (exc.error.code if exc.error else "") or ""
        message = exc.error.message if exc.error and exc.error.message else exc.message
        if isinstance(exc, ClientAuthenticationError):  # no usable credential, or ARM refused its token
            raise PrecheckError(f"Azure credentials refused: {message}", code=code or "AuthenticationFailed") from exc
        raise ERROR_CODES.classify(code, message, http_status=exc.status_code) from exc
    except (ServiceRequestError, ServiceResponseError) as exc:
        raise TransientError(f"Azure Resource Manager unreachable: {exc}") from exc


class AzureProvider(Provider):
    name = "azure"

    def __init__(self, config: AzureConfig):
        from azure.mgmt.compute import ComputeManagementClient, models

        self.config = config
        self._models = models
        credential = config.credential
        if credential is None:
            from azure.identity import DefaultAzureCredential

            credential = DefaultAzureCredential()
        optional = {"base_url": config.endpoint} if config.endpoint else {}
        self._vms = ComputeManagementClient(
            credential,
            config.subscription_id,
            polling_interval=config.polling_interval_s,
            connection_verify=config.connection_verify,
            retry_total=config.retry_total,
            **optional,
        ).virtual_machines

    @property
    def bills_storage_when_stopped(self) -> bool:
        # A deallocated VM keeps its managed OS disk, billed by the month until deleted.
        return self.config.eviction_policy == "Deallocate"

    @property
    def stopped_storage_sku(self) -> str:
        return os_disk_price_sku(self.config.os_disk_tier) if self.bills_storage_when_stopped else ""

    def vm_name(self, instance_id: int) -> str:
        return f"respawn-{instance_id}"

    def launch(self, request: LaunchRequest) -> str:
        name = self.vm_name(request.instance_id)
        image = request.machine_image or self.config.image
        if not URN.fullmatch(image):
            raise PrecheckError(f"Azure image must be a URN 'publisher:offer:sku:version', got {image!r}")
        existing = self.describe(name)
        if existing.state == CloudState.STOPPED:
            with translated_errors():
                self._vms.begin_start(self.config.resource_group, name).result()
            return name
        if existing.state != CloudState.GONE:
            return name
        try:
            with translated_errors():
                self._vms.begin_create_or_update(self.config.resource_group, name, self._vm(request, name, image)).result()
        except (CapacityError, PrecheckError):
            # ARM keeps a VM whose create failed, in state Failed: remove it so nothing
            # is left billing. If that delete cannot be sent now, reconcile finds the
            # tagged leftover later; the create's error is the one to report.
            with suppress(TransientError):
                self._delete(name)
            raise
        return name

    def _vm(self, request: LaunchRequest, name: str, image: str):
        m = self._models
        placement = request.placement
        publisher, offer, sku, version = image.split(":")
        spot = placement.market == Market.SPOT
        user = self.config.admin_username
        properties = m.VirtualMachineProperties(
            hardware_profile=m.HardwareProfile(vm_size=placement.instance_type),
            storage_profile=m.StorageProfile(
                image_reference=m.ImageReference(publisher=publisher, offer=offer, sku=sku, version=version),
                os_disk=self._os_disk(),
            ),
            os_profile=m.OSProfile(
                computer_name=name,
                admin_username=user,
                custom_data=base64.b64encode(request.user_data.encode()).decode(),
                linux_configuration=m.LinuxConfiguration(
                    disable_password_authentication=True,
                    ssh=m.SshConfiguration(
                        public_keys=[m.SshPublicKey(path=f"/home/{user}/.ssh/authorized_keys", key_data=self.config.ssh_public_key)]
                    ),
                ),
            ),
            network_profile=m.NetworkProfile(
                network_api_version="2022-11-01",
                network_interface_configurations=[
                    m.VirtualMachineNetworkInterfaceConfiguration(
                        name=f"{name}-nic",
                        properties=m.VirtualMachineNetworkInterfaceConfigurationProperties(
                            primary=True,
                            delete_option="Delete",
                            ip_configurations=[
                                m.VirtualMachineNetworkInterfaceIPConfiguration(
                                    name="ipconfig",
                                    properties=m.VirtualMachineNetworkInterfaceIPConfigurationProperties(
                                        subnet=m.SubResource(id=self.config.subnet_id)
                                    ),
                                )
                            ],
                        ),
                    )
                ],
            ),
            priority="Spot" if spot else "Regular",
            eviction_policy=self.config.eviction_policy if spot else None,
            billing_profile=m.BillingProfile(max_price=_max_price(request)) if spot else None,
        )
        identity = self.config.managed_identity
        return m.VirtualMachine(
            location=placement.region,
            zones=[placement.zone] if placement.zone else None,
            tags={**request.extra_tags, TAG_JOB: str(request.job_id), TAG_INSTANCE: str(request.instance_id)},
            identity=m.VirtualMachineIdentity(type="UserAssigned", user_assigned_identities={
                identity: m.UserAssignedIdentitiesValue()}) if identity else None,
            properties=properties,
        )

    def agent_environment(self) -> dict[str, str]:
        env = {"AZURE_CLIENT_ID": self.config.managed_identity_client_id,
               "AZURE_STORAGE_ACCOUNT_URL": self.config.storage_account_url}
        return {name: value for name, value in env.items() if value}

    def _os_disk(self):
        m = self._models
        account_type, size_gib = OS_DISK_TIERS[self.config.os_disk_tier]
        # Deleted with the VM, so terminating an evicted, deallocated VM ends its disk's billing too.
        return m.OSDisk(create_option="FromImage", delete_option="Delete", disk_size_gb=size_gib,
                        managed_disk=m.ManagedDiskParameters(storage_account_type=account_type))

    def interrupt(self, provider_instance_id: str, *, with_notice: bool) -> str:
        """With a notice: ARM's simulated eviction of a Spot VM (a Preempt scheduled event,
        then the eviction by the VM's policy). Without: a forced delete, no event first."""
        rg = self.config.resource_group
        if with_notice:
            permission = "Microsoft.Compute/virtualMachines/simulateEviction/action"
            call = lambda: self._vms.simulate_eviction(rg, provider_instance_id)  # noqa: E731
        else:
            permission = "Microsoft.Compute/virtualMachines/delete"
            call = lambda: self._vms.begin_delete(rg, provider_instance_id, force_deletion=True,  # noqa: E731
                                                  polling=False)
        with naming_permission(permission, ACCESS_DENIED), translated_errors():
            call()
        return "simulateEviction" if with_notice else "forced delete"

    def terminate(self, provider_instance_id: str) -> None:
        self._delete(provider_instance_id)

    def _delete(self, name: str) -> None:
        with translated_errors():
            # Not waited for: ARM accepted the delete; reconcile re-checks what is still listed.
            self._vms.begin_delete(self.config.resource_group, name, polling=False)

    def describe(self, provider_instance_id: str) -> CloudInstance:
        from azure.core.exceptions import ResourceNotFoundError

        with translated_errors():
            try:
                vm = self._vms.get(self.config.resource_group, provider_instance_id, expand="instanceView")
            except ResourceNotFoundError:
                return CloudInstance(provider_instance_id=provider_instance_id, state=CloudState.GONE)
        return _cloud_instance(vm, vm.properties.instance_view.statuses if vm.properties.instance_view else [])

    def list_ours(self) -> list[CloudInstance]:
        with translated_errors():
            tagged = [vm for vm in self._vms.list(self.config.resource_group) if TAG_INSTANCE in (vm.tags or {})]
            # The list carries no power state; a deallocated VM must not read as running.
            return [_cloud_instance(vm, self._vms.instance_view(self.config.resource_group, vm.name).statuses) for vm in tagged]


def os_disk_price_sku(tier: str) -> str:
    """The Retail Prices API's skuName of a locally redundant disk of `tier`."""
    return f"{tier} LRS"


def _max_price(request: LaunchRequest) -> float:
    # -1: pay up to the on-demand price, never evicted for price (Azure's convention).
    return -1 if request.max_price_per_hour is None else request.max_price_per_hour


def _state(statuses) -> str:
    codes = [status.code.lower() for status in statuses or [] if status.code]
    if any(code in ("provisioningstate/deleting", "provisioningstate/failed") for code in codes):
        return CloudState.GONE
    power = next((code.partition("/")[2] for code in codes if code.startswith("powerstate/")), "")
    return POWER_STATES.get(power, CloudState.PENDING)


def _cloud_instance(vm, statuses) -> CloudInstance:
    job_id, instance_id = ids_from_tags(vm.tags or {}, job_key=TAG_JOB, instance_key=TAG_INSTANCE)
    return CloudInstance(
        provider_instance_id=vm.name,
        state=_state(statuses),
        zone=(vm.zones or [""])[0],
        instance_type=vm.properties.hardware_profile.vm_size if vm.properties and vm.properties.hardware_profile else "",
        job_id=job_id,
        instance_id=instance_id,
    )
