"""The sweeps over VMs the database has let go: a claimed preemption put to the cloud,
disks an eviction kept, and VMs with our tags the database does not know."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from respawn_server.jobs.core.choices import EndReason, InstanceState
from respawn_server.jobs.core.transitions import log_job_event
from respawn_server.jobs.fleet.providers.base import CloudState
from respawn_server.jobs.fleet.registry import REGIONAL, provider_for
from respawn_server.jobs.models import Instance

log = logging.getLogger(__name__)


# How long after an agent's `preempted` exit the cloud has to take the VM back
# (confirm_claimed_preemptions); until then nothing terminates it.
CLAIM_WAIT = timedelta(minutes=5)


AWAITING_THE_CLOUD = Q(end_reason=EndReason.PREEMPTED, preemption_confirmed__isnull=True)


def confirm_claimed_preemptions() -> int:
    """Put an agent's `preempted` exit to the cloud before it feeds the interruption
    rates every team's placement uses (respawn_server.jobs.fleet.placement.SEEN_INTERRUPTED): any VM
    can say it was preempted. Its VM gone or stopped confirms it; still running once
    CLAIM_WAIT has passed since the exit (the cloud takes a spot VM within minutes of
    its notice: AWS 2, GCP 0.5, Azure at NotBefore), it was not the cloud's doing.
    Until then neither this module nor anything else terminates that VM, so that its
    absence is the cloud's word, not ours. Returns how many claims were judged."""
    now = timezone.now()
    claimed = (Instance.objects.filter(end_reason=EndReason.PREEMPTED, preemption_confirmed__isnull=True)
               .order_by("ended_at")[: settings.RESPAWN["RECONCILE_BATCH"]])
    judged = 0
    for instance in claimed:
        confirmed = False
        if instance.provider_instance_id:
            state = provider_for(instance.provider, instance.region).describe(instance.provider_instance_id).state
            confirmed = state in (CloudState.GONE, CloudState.STOPPED)
            if not confirmed and instance.ended_at and now - instance.ended_at < CLAIM_WAIT:
                continue
        Instance.objects.filter(pk=instance.pk).update(preemption_confirmed=confirmed)
        if not confirmed:
            log_job_event(instance.job_id, f"instance {instance.pk} said it was preempted, but the cloud still ran "
                                           "it: not counted in the interruption rates")
        judged += 1
    return judged


def release_stopped_disks() -> int:
    """Delete the VMs that an eviction stopped rather than deleted (their disk bills by
    the month until then) and record when each was seen gone: the ledger bills the disk
    up to that moment. A VM still there is deleted now (not waited for) and looked at
    again next period, so its release is recorded at most one period after Azure
    finished the delete: the figure errs towards what the cloud charges, never below.
    An eviction only its agent reported is put to the cloud first (a VM deleted here
    could not tell), and waited for while the cloud has not answered it.
    Returns how many releases were recorded."""
    confirm_claimed_preemptions()
    pending = (Instance.objects.filter(Instance.DISK_KEPT, storage_released_at__isnull=True)
               .exclude(AWAITING_THE_CLOUD).order_by("ended_at")[: settings.RESPAWN["RECONCILE_BATCH"]])
    released = 0
    for instance in pending:
        if instance.provider_instance_id:
            cloud = provider_for(instance.provider, instance.region)
            if cloud.describe(instance.provider_instance_id).state != CloudState.GONE:
                cloud.terminate(instance.provider_instance_id)
                continue
        # Never before its end (the clocks of two workers may differ): the ledger refuses that.
        at = max(timezone.now(), instance.ended_at or timezone.now())
        released += Instance.objects.filter(pk=instance.pk, storage_released_at__isnull=True).update(
            storage_released_at=at)
    return released


def reap_orphans() -> int:
    """Terminate VMs carrying our tags that the database does not know as live, except
    those whose claimed preemption waits for the cloud's word (confirm_claimed_preemptions)."""
    live = set(Instance.objects.filter(Q(state__in=InstanceState.LIVE) | AWAITING_THE_CLOUD)
               .values_list("pk", flat=True))
    reaped = 0
    for name in settings.RESPAWN["PROVIDERS"]:
        for region in _regions_in_use(name):
            cloud = provider_for(name, region)
            for vm in cloud.list_ours():
                if vm.state != CloudState.GONE and vm.instance_id not in live:
                    log.warning("terminating orphan VM %s (instance %s) on %s", vm.provider_instance_id,
                                vm.instance_id, name)
                    cloud.terminate(vm.provider_instance_id)
                    reaped += 1
    return reaped


def _regions_in_use(provider: str) -> list[str]:
    recent = timezone.now() - timedelta(days=7)
    regions = Instance.objects.filter(provider=provider, requested_at__gte=recent).values_list("region", flat=True)
    # A regional provider (AWS) has no client without a region: with none in use there is nothing to list.
    return sorted(set(regions)) or ([] if provider in REGIONAL else [""])
