"""A job's post step (DESIGN §4 `finishing`): its on-demand VM, placed where training
ran, and another when one is lost."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from respawn.protocol import Purpose
from respawn_server.jobs.core.choices import EndReason, FailureCause, InstanceState, JobStatus, Market
from respawn_server.jobs.core.transitions import log_job_event, transition_job
from respawn_server.jobs.fleet import placement as placements
from respawn_server.jobs.fleet.instances import enqueue_launches, new_instance
from respawn_server.jobs.fleet.providers.base import Placement
from respawn_server.jobs.models import Job, PriceQuote


# On-demand VMs one post step may use (a lost VM, a capacity refusal) before its job fails.
POST_MAX_LAUNCHES = 3


def start_post_steps() -> list[int]:
    """Launch the post step of jobs whose training succeeded (`finishing`) and that hold
    no VM: its first VM, or the next after one was lost. Returns the instance ids created."""
    waiting = Job.objects.filter(status=JobStatus.FINISHING).exclude(instances__state__in=InstanceState.LIVE)
    batch = waiting.values_list("pk", flat=True)[: settings.RESPAWN["SCHEDULE_BATCH"]]
    return [instance_id for instance_id in map(_start_post_step, batch) if instance_id is not None]


def _start_post_step(job_id: int) -> int | None:
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id, status=JobStatus.FINISHING).first()
        if job is None or job.instances.filter(state__in=InstanceState.LIVE).exists():
            return None  # another worker got there first
        launched = job.instances.filter(purpose=Purpose.POST).count()
        chosen = _post_placement(job) if launched < POST_MAX_LAUNCHES else None
        if chosen is None:
            why = (f"post step: {launched} on-demand VMs ended without finishing it" if launched >= POST_MAX_LAUNCHES
                   else "post step: no on-demand placement (no price for the training's instance type in the "
                        "zones it ran in, or each refused an earlier post VM for capacity)")
            transition_job(job.pk, JobStatus.FINISHING, JobStatus.FAILED, message=why,
                           failure_cause=FailureCause.NO_CAPACITY, failure_message=why)
            return None
        instance_id = new_instance(job, 0, chosen, "", purpose=Purpose.POST)
        p = chosen.placement
        log_job_event(job.pk, f"post step: launching instance {instance_id} on {p.provider} {p.zone} "
                              f"{p.instance_type} (on-demand, ${chosen.usd_per_hour}/h)")
        transaction.on_commit(lambda: enqueue_launches([instance_id]))
    return instance_id


def _post_placement(job: Job) -> placements.PricedPlacement | None:
    """On-demand, on the cloud, region and instance type of the training's last VM: in
    the zones training used, newest first, but not one that refused an earlier post VM
    for capacity; priced like the ledger prices it (a zone's quote, else the region's)."""
    trained = job.instances.filter(purpose=Purpose.TRAIN).order_by("-pk")
    last = trained.first()
    if last is None:
        return None
    refused = set(job.instances.filter(purpose=Purpose.POST, end_reason=EndReason.CAPACITY_ERROR)
                  .values_list("zone", flat=True))
    zones = dict.fromkeys(trained.filter(provider=last.provider, region=last.region).values_list("zone", flat=True))
    for zone in (z for z in zones if z not in refused):
        quote = PriceQuote.objects.filter(
            provider=last.provider, region=last.region, zone__in=(zone, ""), instance_type=last.instance_type,
            market=Market.ON_DEMAND, observed_at__lte=timezone.now()).order_by("-zone", "-observed_at").first()
        if quote is not None:
            placement = Placement(provider=last.provider, region=last.region, zone=zone,
                                  instance_type=last.instance_type, market=Market.ON_DEMAND)
            return placements.PricedPlacement(placement, quote.usd_per_hour)
    return None
