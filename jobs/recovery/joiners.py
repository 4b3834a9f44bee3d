"""An elastic gang grows back (docs/elastic.md): joiners launched beside it, their
readiness, the regroup with them at a checkpoint's commit, or their release."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, OuterRef, Subquery
from django.utils import timezone

from respawn.protocol import Action
from respawn_server.jobs.core.choices import InstanceState, JobStatus
from respawn_server.jobs.core.services import fence
from respawn_server.jobs.core.transitions import lock_job_endings, log_job_event
from respawn_server.jobs.fleet import placement as placements
from respawn_server.jobs.fleet.instances import enqueue_launches, new_instance, no_gpu_room
from respawn_server.jobs.fleet.providers.base import Placement
from respawn_server.jobs.models import Instance, Job, WorldSize
from respawn_server.jobs.money import budget
from respawn_server.jobs.recovery.elastic import regroup
from respawn_server.jobs.recovery.gangs import current_world_size, live_joiners, training_nodes

log = logging.getLogger(__name__)


def grow_elastic_gangs() -> int:
    """Elastic gangs below their full size try to grow back (docs/elastic.md): GROW_RETRY_S
    after they shrank or after their last try, joiners for the missing nodes are launched
    where the gang trains (its nodes talk to each other every step), within the GPU limits
    and the budget. Each boots and prepares, then stands by; once all are ready the gang is
    asked for a checkpoint and regroups with them at its commit (grow_with_joiners).
    No capacity for one (or one lost) ends them all, and the gang trains on at its size.
    Returns how many joiners were launched."""
    now = timezone.now()
    retry = timedelta(seconds=settings.RESPAWN["GROW_RETRY_S"])
    launched = []
    newest_size = WorldSize.objects.filter(job=OuterRef("pk")).order_by("-at", "-id").values("world_size")[:1]
    shrunk = Job.objects.filter(status=JobStatus.RUNNING, nodes_min__lt=F("nodes")).annotate(
        trains_on=Subquery(newest_size)).filter(trains_on__lt=F("nodes")).order_by("pk")
    for job_id in shrunk.values_list("pk", flat=True)[: settings.RESPAWN["SCHEDULE_BATCH"]]:
        with transaction.atomic():
            lock_job_endings(job_id)  # no node ends meanwhile: joiners are for the gang as it is
            job = Job.objects.select_related("team").get(pk=job_id)
            nodes = list(training_nodes(job.pk).order_by("rank"))
            missing = job.nodes - len(nodes)
            changed = max(filter(None, [job.world_sizes.order_by("-at").values_list("at", flat=True).first(),
                                        job.instances.filter(joining=True).order_by("-requested_at")
                                        .values_list("requested_at", flat=True).first()]), default=None)
            if job.status != JobStatus.RUNNING or missing <= 0 or not nodes or changed is None or now - changed < retry:
                continue
            if len(nodes) != current_world_size(job) or \
                    any(node.state != InstanceState.RUNNING or node.trainer_exited_at for node in nodes) or \
                    Instance.objects.filter(job=job, state__in=InstanceState.LIVE).exclude(
                        pk__in=[node.pk for node in nodes]).exists():
                continue  # a node ended, regrouping, handing over to spares, or growing already
            where = _grow_placement(job, nodes[0], missing, now)
            if isinstance(where, str):
                log.info("job %s stays at %s of %s nodes for now: %s", job.pk, len(nodes), job.nodes, where)
                continue
            ids = [new_instance(job, rank, where, nodes[0].rendezvous_addr, joining=True,
                                generation=nodes[0].gang_generation) for rank in range(len(nodes), job.nodes)]
            p = where.placement
            log_job_event(job.pk, f"joiner instance{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))} launching "
                                  f"on {p.provider} {p.zone} {p.instance_type} ({p.market}, ${where.usd_per_hour}/h) "
                                  f"to grow the gang from {len(nodes)} to {job.nodes} nodes")
            transaction.on_commit(lambda ids=ids: enqueue_launches(ids))
            launched += ids
    return len(launched)


def _grow_placement(job: Job, rank0: Instance, count: int, now) -> str | placements.PricedPlacement:
    """Where `count` joiners go: beside the gang's rank 0, at today's price; or why none."""
    no_room = no_gpu_room(job, count, "beside the gang")
    if no_room:
        return no_room
    here = Placement(provider=rank0.provider, region=rank0.region, zone=rank0.zone,
                     instance_type=rank0.instance_type, market=rank0.market)
    priced = next((p for p in placements.priced_placements(job, rank0.market, now) if p.placement == here), None)
    if priced is None:
        return f"{rank0.provider} {rank0.zone} {rank0.instance_type} ({rank0.market}) has no price now"
    return budget.hold_reason(job.team, budget.job_remaining_cost(priced.usd_per_hour, job, count)) or priced


def joiner_ready(joiner: Instance) -> None:
    """A joiner, booted and prepared, asked whether it may train. Once every joiner of the
    job is ready, the gang is asked for a checkpoint (of rank 0: a request to any rank
    saves the same step on all), at whose commit it grows (grow_with_joiners). The joiners
    are locked first, so two asking at once see each other's mark."""
    with transaction.atomic():
        joiners = list(live_joiners(joiner.job_id).select_for_update().order_by("pk"))
        if not Instance.objects.filter(pk=joiner.pk, standby_ready_at__isnull=True).update(
                standby_ready_at=timezone.now()):
            return  # asked before: the checkpoint, if due, was asked for then
        if any(other.standby_ready_at is None for other in joiners if other.pk != joiner.pk):
            return
        asked = training_nodes(joiner.job_id).filter(rank=0, requested_action="").update(
            requested_action=Action.CHECKPOINT, requested_action_at=timezone.now())
    log_job_event(joiner.job_id, f"joiner instance{'s' if len(joiners) > 1 else ''} "
                                 f"{', '.join(str(j.pk) for j in joiners)} ready: the gang "
                                 + ("is asked for a checkpoint and grows when it commits" if asked else
                                    "grows at its next checkpoint"))


def grow_with_joiners(job_id: int) -> bool:
    """A checkpoint of the job committed: if every joiner of it is ready, the gang regroups
    with them from that checkpoint, at its full size (docs/elastic.md). Nothing while a
    node's trainer has exited (a regroup or a stop is being decided) or spares stand by (a
    notice hands the gang over first). Whether it grew."""
    with transaction.atomic():
        lock_job_endings(job_id)  # no node ends, and no other regroup happens, meanwhile
        joiners = list(live_joiners(job_id).select_for_update().order_by("pk"))
        if not joiners or any(j.state != InstanceState.RUNNING or j.standby_ready_at is None for j in joiners):
            return False
        job = Job.objects.get(pk=job_id)
        nodes = list(training_nodes(job_id).select_related("resume_checkpoint").order_by("rank"))
        spares = Instance.objects.filter(job_id=job_id, state__in=InstanceState.LIVE, standby_for__isnull=False)
        if job.status != JobStatus.RUNNING or not nodes or any(n.trainer_exited_at for n in nodes) or spares.exists():
            return False
        regroup(job, nodes + joiners, f"capacity is back: the gang grows from {len(nodes)} to "
                                      f"{len(nodes) + len(joiners)} of {job.nodes} nodes")
        return True


def release_joiners(job_id: int, why: str) -> int:
    """End the job's joiners, which the gang will not take in, and terminate their VMs: a
    gang grows whole or not at all, and only the gang that launched them. Returns how
    many ended."""
    joiners = fence(live_joiners(job_id), f"joiner released: {why}")
    if joiners:
        log_job_event(job_id, f"{len(joiners)} joiner(s) released: {why}")
    return len(joiners)
