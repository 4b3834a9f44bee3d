"""A VM's agent coming up: its register (the instance runs, its resume checkpoint is
fixed), the registers the server failed to answer, a boot that could not set up the
agent, and how its prepare step went."""

from __future__ import annotations

from django.db import transaction
from django.db.models import F, Sum
from django.utils import timezone

from respawn.protocol import PrepareOutcome, Purpose
from respawn_server.jobs.core.choices import InstanceState
from respawn_server.jobs.core.services import heartbeat_timeout, usable_checkpoint
from respawn_server.jobs.core.transitions import log_job_event, transition_instance
from respawn_server.jobs.models import Instance, Job
from respawn_server.jobs.recovery.after_end import give_up_registering
from respawn_server.jobs.recovery.gangs import GANG_PORT, running_once_all_registered


@transaction.atomic
def register_instance(instance: Instance, *, hostname: str, agent_version: str, provider_instance_id: str) -> None:
    """The agent is up: the instance runs, and its resume checkpoint is fixed now. Its
    checkpoint interval is the fleet's to set (respawn_server.jobs.fleet.placement.refresh_interval)."""
    now = timezone.now()
    # A spare's checkpoint is fixed when it is promoted (promote_spare), not before the notice
    # save; a joiner's when its gang regroups with it.
    standing_by = instance.standby_for_id is not None or instance.joining
    resume = None if standing_by else usable_checkpoint(instance.job)
    if instance.state == InstanceState.REQUESTED:
        transition_instance(instance.pk, InstanceState.REQUESTED, InstanceState.BOOTING, message="agent registered")
    transition_instance(
        instance.pk,
        InstanceState.BOOTING,
        InstanceState.RUNNING,
        message="agent registered",
        registered_at=now,
        running_at=now,
        hostname=hostname[:200],
        agent_version=agent_version[:50],
        last_heartbeat_at=now,
        heartbeat_deadline=now + heartbeat_timeout(),
        resume_checkpoint=resume,
        # where its trainer starts, until it reports (a spare's heartbeats must not move the job's step back)
        last_step=resume.step if resume else (instance.job.last_step if standing_by else 0),
        # The VM's id as the cloud gave it at launch wins over the agent's word (it decides
        # which VM the control plane asks about and terminates); the agent's is taken only
        # when it registered before its launch was recorded.
        **({"provider_instance_id": provider_instance_id[:200]}
           if provider_instance_id and not instance.provider_instance_id else {}),
    )
    if instance.rank == 0 and instance.world_size > 1 and not instance.rendezvous_addr:
        Instance.objects.filter(job_id=instance.job_id, state__in=InstanceState.LIVE, rendezvous_addr="").update(
            rendezvous_addr=f"{hostname}:{GANG_PORT}")
    instance.refresh_from_db()
    # A gang's ranks register at once: under READ COMMITTED each would count only itself as
    # running and none would move the job on. The job's row lock orders the counts.
    job = Job.objects.select_for_update(of=("self",)).get(pk=instance.job_id)
    running_once_all_registered(job)


# Registers of a job's VMs the server may fail to answer before the job fails (cause
# `setup`): enough to ride out a blip, few enough that no VM is relaunched for long.
REGISTER_MAX_FAILURES = 5


@transaction.atomic
def register_failed(instance_id: int, error: str) -> int:
    """The server could not answer a register of this instance (a job spec it cannot
    build, say). Counted, and said on the job's page; once the job's VMs that never
    registered have failed REGISTER_MAX_FAILURES registers between them, the job fails.
    Returns that count."""
    Instance.objects.filter(pk=instance_id).update(register_failures=F("register_failures") + 1)
    instance = Instance.objects.get(pk=instance_id)
    failures = Instance.objects.filter(job_id=instance.job_id, registered_at__isnull=True).aggregate(
        n=Sum("register_failures"))["n"]
    log_job_event(instance.job_id, f"the control plane failed to answer the register of instance {instance.pk} "
                                   f"({failures} of {REGISTER_MAX_FAILURES} failures allowed): {error}")
    if failures >= REGISTER_MAX_FAILURES:
        give_up_registering(instance, f"the control plane failed {failures} registers of this job's VMs; "
                                      f"the last: {error}")
    return failures


def agent_setup_failed(instance: Instance, message: str) -> None:
    """The VM's boot script could not install the agent (a wheel whose digest is not the
    pinned one, a download or pip that failed): no agent will ever run there, and a
    relaunch would boot the same script, so the job fails with cause `setup`."""
    give_up_registering(instance, f"instance {instance.pk}: the VM could not set up the agent: {message}")


def record_prepare(instance: Instance, *, outcome: str, key: str, uri: str, seconds, message: str) -> None:
    """The job's events say how its prepare step went on each VM (its failure also ends the
    instance, through the exit report that follows)."""
    took = f" in {seconds:.1f}s" if seconds is not None else ""
    where = f"instance {instance.pk}" + (" (post step)" if instance.purpose == Purpose.POST else "")
    if outcome == PrepareOutcome.REUSED:
        text = f"prepare step skipped on {where}: outputs for key {key[:12]} already stored at {uri}"
    elif outcome == PrepareOutcome.RAN:
        stored = f"; outputs stored at {uri}" if uri else ""
        text = f"prepare step ran on {where}{took} (key {key[:12]}){stored}"
    else:
        text = f"prepare step failed on {where}{took}: {message}"
    log_job_event(instance.job_id, text)
