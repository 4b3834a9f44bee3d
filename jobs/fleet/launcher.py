"""Starting and stopping VMs: a launch (or the refusal that ends a gang's launch), a
terminate, and the local VMs' end when the control plane stops."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction

from respawn.protocol import Purpose
from respawn_server.jobs.core.choices import EndReason, FailureCause, InstanceState, InterruptionKind, JobStatus, Market
from respawn_server.jobs.core.services import enqueue_terminate, nudge_schedule
from respawn_server.jobs.core.transitions import end_instance, log_job_event, transition_instance, transition_job
from respawn_server.jobs.fleet import agent_dist
from respawn_server.jobs.fleet import placement as placements
from respawn_server.jobs.fleet.instances import bootstrap_token_for
from respawn_server.jobs.fleet.providers.base import CapacityError, LaunchRequest, PrecheckError, render_user_data
from respawn_server.jobs.fleet.registry import provider_for
from respawn_server.jobs.models import Instance, InterruptionEvent, Job
from respawn_server.jobs.recovery.after_end import after_instance_ended

log = logging.getLogger(__name__)


def launch(instance_id: int) -> None:
    """Start the VM of a `requested` instance (safe to run twice)."""
    instance = Instance.objects.select_related("job").filter(pk=instance_id).first()
    if instance is None or instance.state != InstanceState.REQUESTED:
        return
    placement = placements.Placement(provider=instance.provider, region=instance.region, zone=instance.zone,
                                     instance_type=instance.instance_type, market=instance.market)
    token = bootstrap_token_for(instance)
    url = settings.RESPAWN["API_URL"]
    cloud = provider_for(instance.provider, instance.region)
    try:
        user_data = render_user_data(control_plane_url=url, bootstrap_token=token, provider=instance.provider,
                                     agent=agent_dist.current(), agent_env=cloud.agent_environment()
                                     ) if cloud.boots_user_data else ""
    except agent_dist.NoAgentDist as exc:
        _precheck_failed(instance, str(exc))
        return
    request = LaunchRequest(
        job_id=instance.job_id, instance_id=instance.pk, client_token=str(instance.client_token), placement=placement,
        user_data=user_data, bootstrap_token=token, control_plane_url=url,
        max_price_per_hour=float(instance.job.max_price_per_hour) if instance.job.max_price_per_hour else None,
        machine_image=instance.job.machine_image.get(instance.provider, ""),
        storage_uri=instance.job.storage_uri,
    )
    try:
        vm_id = cloud.launch(request)
    except CapacityError as exc:
        _capacity_error(instance, placement, str(exc))
        return
    except PrecheckError as exc:
        _precheck_failed(instance, str(exc), FailureCause.CONTROLLER if exc.ours else FailureCause.PRECHECKS)
        return
    # A spot VM the cloud would stop, not delete, on eviction keeps a billed disk: say which.
    disk = cloud.stopped_storage_sku if instance.market == Market.SPOT else ""
    transition_instance(instance.pk, InstanceState.REQUESTED, InstanceState.BOOTING,
                        message=f"launched {vm_id}", provider_instance_id=vm_id, stopped_disk_sku=disk)
    log.info("instance %s of job %s launched as %s in %s", instance.pk, instance.job_id, vm_id, instance.zone)


def _capacity_error(instance: Instance, placement, message: str) -> None:
    """Try the next placement at once; the ended instance puts this one on back-off."""
    log.warning("no capacity for instance %s in %s %s: %s", instance.pk, placement.zone, placement.instance_type,
                message)
    with transaction.atomic():
        InterruptionEvent.objects.create(instance=instance, kind=InterruptionKind.CAPACITY_ERROR,
                                         source="provider_api", raw=message[:16384])
        why = f"capacity error in {placement.zone}: {message}"
        if instance.joining:  # the gang trains on at its size (recovery.after_end._after_joiner_ended)
            if end_instance(instance, EndReason.CAPACITY_ERROR, message=why):
                after_instance_ended(instance.job_id, EndReason.CAPACITY_ERROR, instance_id=instance.pk)
            return
        # An elastic gang starts with the nodes it got, if they are enough (go_on_with_survivors).
        if instance.job.elastic and end_instance(instance, EndReason.CAPACITY_ERROR, message=why) and \
                after_instance_ended(instance.job_id, EndReason.CAPACITY_ERROR, instance_id=instance.pk):
            return
        _end_gang(instance.job_id, EndReason.CAPACITY_ERROR, why)
        job = Job.objects.get(pk=instance.job_id)
        if job.status == JobStatus.PROVISIONING:
            transition_job(job.pk, JobStatus.PROVISIONING, JobStatus.RECOVERING,
                           message=f"no capacity in {placement.zone}; trying elsewhere")
    nudge_schedule()


def _precheck_failed(instance: Instance, message: str, cause: str = FailureCause.PRECHECKS) -> None:
    """The launch was refused. `cause` CONTROLLER: the refusal was of the control plane's
    own choice (PrecheckError.ours), and the message says so rather than blame the job."""
    waiting = JobStatus.FINISHING if instance.purpose == Purpose.POST else JobStatus.PROVISIONING
    if cause == FailureCause.CONTROLLER:
        message = f"Respawn placed this VM where {instance.provider} refused it (not your job's spec): {message}"
    with transaction.atomic():
        _end_gang(instance.job_id, EndReason.FAILED, f"launch refused: {message}")
        transition_job(instance.job_id, waiting, JobStatus.FAILED, message=f"launch refused by {instance.provider}",
                       failure_cause=cause, failure_message=message[:8000])


def _end_gang(job_id: int, end_reason: str, message: str) -> None:
    """A gang launches all or none: end every not-yet-running node of the job."""
    for other in Instance.objects.filter(job_id=job_id, state__in=InstanceState.LIVE):
        if other.state in (InstanceState.REQUESTED, InstanceState.BOOTING):
            end_instance(other, end_reason, message=message)
            if other.provider_instance_id:
                enqueue_terminate(other.pk)


def terminate(instance_id: int) -> None:
    """Stop a VM's billing. A live instance ends `cancelled` (its job is cancelling)
    or `fenced`; an ended one is terminated in case its VM still runs."""
    instance = Instance.objects.select_related("job").filter(pk=instance_id).first()
    if instance is None:
        return
    if instance.provider_instance_id:
        provider_for(instance.provider, instance.region).terminate(instance.provider_instance_id)
    if instance.state in InstanceState.LIVE:
        reason = EndReason.CANCELLED if instance.job.status == JobStatus.CANCELLING else EndReason.FENCED
        with transaction.atomic():
            if end_instance(instance, reason, message="terminated by the control plane"):
                after_instance_ended(instance.job_id, reason)


def terminate_local_vms() -> list[str]:
    """The control plane running the local VMs stops (`make demo` on Ctrl-C): each live
    local instance ends `cancelled` at this moment, when its VM is terminated, so it is
    billed up to now and is no interruption (no InterruptionEvent, no preemption, no
    back-off of its zone); its job resumes from its newest checkpoint on a new VM when
    the control plane runs again. Call it while the API still serves and with no worker
    left to relaunch: what the agents commit on their way down (a last checkpoint) is
    recorded, and no new VM starts. Returns the ids of the VMs terminated."""
    for instance in Instance.objects.filter(provider="local", state__in=InstanceState.LIVE):
        with transaction.atomic():
            if end_instance(instance, EndReason.CANCELLED, message="terminated: the control plane is stopping"):
                log_job_event(instance.job_id, f"instance {instance.pk} terminated as the control plane stopped; "
                                               "the job resumes from its newest checkpoint when it runs again")
                after_instance_ended(instance.job_id, EndReason.CANCELLED)
    return provider_for("local").terminate_all()
