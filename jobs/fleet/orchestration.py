"""Turning queued jobs into running ones and keeping them running.

Everything here runs in Celery workers (the web process only records intent).
Each step re-reads the rows it acts on and is safe to run twice: an Instance row
with its client token exists before any cloud call, so a worker dying mid-call
leaves a row the next attempt (or the reconciler) finds, and providers look a VM
up by our tag before making another."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, OuterRef, Q, Subquery, Sum
from django.utils import timezone

from respawn.protocol import Action, Purpose
from respawn_server.jobs.core import nudges
from respawn_server.jobs.core.choices import EndReason, FailureCause, InstanceState, InterruptionKind, JobStatus, Market
from respawn_server.jobs.core.services import (after_instance_ended, current_world_size, end_notice_hold, enqueue_terminate,
                                free_local_address, give_up_registering, judge_failure, mark_lost, nudge_schedule,
                                release_spares, request_action, training_nodes)
from respawn_server.jobs.core.signals import launch_held
from respawn_server.jobs.core.transitions import end_instance, lock_job_endings, log_job_event, transition_instance, transition_job
from respawn_server.jobs.fleet import agent_dist
from respawn_server.jobs.fleet import placement as placements
from respawn_server.jobs.fleet.providers.base import (CapacityError, CloudState, LaunchRequest, Placement, PrecheckError,
                                       render_user_data)
from respawn_server.jobs.fleet.registry import REGIONAL, provider_for
from respawn_server.jobs.models import Instance, InterruptionEvent, Job, PriceQuote, WorldSize
from respawn_server.jobs.money import budget
from respawn_server.jobs.people.tokens import BOOTSTRAP_PREFIX, hash_token

log = logging.getLogger(__name__)

# On-demand VMs one post step may use (a lost VM, a capacity refusal) before its job fails.
POST_MAX_LAUNCHES = 3
# How long after an agent's `preempted` exit the cloud has to take the VM back
# (confirm_claimed_preemptions); until then nothing terminates it.
CLAIM_WAIT = timedelta(minutes=5)
AWAITING_THE_CLOUD = Q(end_reason=EndReason.PREEMPTED, preemption_confirmed__isnull=True)


def bootstrap_token_for(instance: Instance) -> str:
    """Derived from the instance's client token with the server's secret, so a
    retried launch renders the same user data and only the digest is stored."""
    mac = hmac.new(settings.SECRET_KEY.encode(), f"bootstrap:{instance.client_token}".encode(), hashlib.sha256)
    return BOOTSTRAP_PREFIX + base64.urlsafe_b64encode(mac.digest()).decode().rstrip("=")


def gpus_in_use(team_id: int | None = None) -> int:
    """GPUs held by live instances, of one team or of the whole deployment."""
    live = Instance.objects.filter(state__in=InstanceState.LIVE)
    if team_id is not None:
        live = live.filter(job__team_id=team_id)
    return live.aggregate(n=Sum("job__accelerator_count"))["n"] or 0


def schedulable_jobs(per_team: int) -> list[Job]:
    """Queued jobs, and recovering jobs whose VMs have all ended: each team's
    first `per_team` by priority and age, so one team's long queue cannot crowd
    another's out of a bounded batch."""
    waiting = Job.objects.filter(status__in=(JobStatus.QUEUED, JobStatus.RECOVERING)).exclude(
        instances__state__in=InstanceState.LIVE).order_by("-priority", "created_at")
    taken: dict[int, int] = {}
    ids = []
    for job_id, team_id in waiting.values_list("pk", "team_id"):
        if taken.get(team_id, 0) < per_team:
            taken[team_id] = taken.get(team_id, 0) + 1
            ids.append(job_id)
    return list(Job.objects.select_related("team").filter(pk__in=ids))


def schedule() -> list[int]:
    """Start what can start now; returns the ids of the instances created.

    Order: recovering jobs first (their work is in flight), then the team using
    the smallest share of its GPU allowance, then priority, then age. Shares are
    updated as jobs start, so two busy teams alternate rather than one draining
    the deployment's allowance."""
    pending = schedulable_jobs(per_team=settings.RESPAWN["SCHEDULE_BATCH"])
    usage = {job.team_id: gpus_in_use(job.team_id) for job in pending}
    created = []
    while pending:
        job = min(pending, key=lambda j: (j.status != JobStatus.RECOVERING, _share(j.team, usage[j.team_id]),
                                          -j.priority, j.created_at))
        pending.remove(job)
        ids = provision(job)
        usage[job.team_id] += len(ids) * job.accelerator_count
        created += ids
    return created + start_post_steps()


def _share(team, in_use: int) -> float:
    allowance = team.max_concurrent_gpus or settings.RESPAWN["MAX_CONCURRENT_GPUS"] or 1
    return in_use / allowance


def provision(job: Job) -> list[int]:
    """Place the job's N nodes and record their Instance rows (launch happens after commit)."""
    team = job.team
    wanted = job.nodes * job.accelerator_count
    if team.max_concurrent_gpus is not None and gpus_in_use(team.pk) + wanted > team.max_concurrent_gpus:
        _wait(job, f"waiting: team GPU limit ({gpus_in_use(team.pk)} of {team.max_concurrent_gpus} in use)")
        return []
    deployment_limit = settings.RESPAWN["MAX_CONCURRENT_GPUS"]
    if deployment_limit is not None and gpus_in_use() + wanted > deployment_limit:
        _wait(job, f"waiting: deployment GPU limit ({gpus_in_use()} of {deployment_limit} in use)")
        return []
    if job.max_preemptions is not None and job.preemptions > job.max_preemptions:
        transition_job(job.pk, job.status, JobStatus.FAILED, message="too many preemptions",
                       failure_cause=FailureCause.NO_CAPACITY)
        return []
    choice = placements.choose(job)
    if choice.chosen is None:
        _wait(job, choice.reason)
        return []
    chosen = choice.chosen
    over_budget = budget.hold_reason(team, budget.job_remaining_cost(chosen.usd_per_hour, job, job.nodes))
    if over_budget:
        if not job.status_reason.startswith(budget.HOLD_PREFIX):  # told once per hold, not each pass
            launch_held.send(sender=Job, job=job, reason=over_budget)
        _wait(job, over_budget)
        return []
    with transaction.atomic():
        if not transition_job(job.pk, job.status, JobStatus.PROVISIONING,
                              message=f"placing {job.nodes} node(s) on {chosen.placement.provider} "
                                      f"{chosen.placement.zone} {chosen.placement.instance_type} "
                                      f"({chosen.placement.market}, ${chosen.usd_per_hour}/h): {choice.reason}"):
            return []  # someone else moved the job first
        rendezvous = gang_rendezvous(job, chosen.placement)
        ids = [_new_instance(job, rank, chosen, rendezvous) for rank in range(job.nodes)]
        WorldSize.objects.create(job=job, world_size=job.nodes, reason=f"{job.nodes} node(s) placed")
        transaction.on_commit(lambda: _enqueue_launches(ids))
    return ids


def _wait(job: Job, reason: str) -> None:
    """`job` waits, saying why and when it is tried again (placement names a back-off's end;
    a limit or a budget is looked at again on the next scheduling pass)."""
    if "next try at" not in reason:
        reason = f"{reason}; {placements.next_try(None, timezone.now())}"
    if job.status == JobStatus.QUEUED:
        Job.objects.filter(pk=job.pk, status=JobStatus.QUEUED).update(status_reason=reason)
    elif job.status == JobStatus.RECOVERING:
        transition_job(job.pk, JobStatus.RECOVERING, JobStatus.PROVISIONING, message=reason)
        transition_job(job.pk, JobStatus.PROVISIONING, JobStatus.QUEUED, message=reason)


def gang_rendezvous(job: Job, placement) -> str:
    """rank 0's torch.distributed address. Local "VMs" share this machine, so a free
    port here is known before launch; on a cloud it is rank 0's host, set when rank 0
    registers (respawn_server.jobs.core.services.register_instance)."""
    if job.nodes == 1 or placement.provider != "local":
        return ""
    return free_local_address()


def _new_instance(job: Job, rank: int, chosen: placements.PricedPlacement, rendezvous: str,
                  purpose: str = Purpose.TRAIN, standby_for: Instance | None = None, joining: bool = False,
                  generation: int = 0) -> int:
    p = chosen.placement
    instance = Instance(job=job, rank=rank, world_size=job.nodes if purpose == Purpose.TRAIN else 1,
                        provider=p.provider, region=p.region, zone=p.zone, instance_type=p.instance_type,
                        market=p.market, price_per_hour_at_launch=chosen.usd_per_hour, rendezvous_addr=rendezvous,
                        purpose=purpose, standby_for=standby_for, joining=joining, gang_generation=generation)
    instance.bootstrap_token_hash = hash_token(bootstrap_token_for(instance))
    instance.save()
    return instance.pk


def launch_spare(instance_id: int) -> list[int]:
    """A notice came for this instance (it is preempting), or a rebalance recommendation
    for a job with spare_on_rebalance (it is still running): place and launch its
    replacement now, as a spare (docs/spares.md) that boots and prepares meanwhile and
    trains once the instance has ended (respawn_server.jobs.core.services.promote_spares). In a gang,
    every node gets one, all in one placement with a rendezvous of their own: a gang
    saves and stops together and hands over whole. Placement's usual rules, with the
    instance's zone taken as just preempted. Nothing when the instance has ended
    meanwhile (said why), the job is not running, spares stand by already, or a GPU
    limit, the budget or placement says no (a noticed job then saves and stops at once
    and recovers as without spares; a recommended one just trains on). Returns the
    spares' ids."""
    with transaction.atomic():
        old = Instance.objects.select_for_update().select_related("job", "job__team").filter(pk=instance_id).first()
        noticed = old is not None and old.state == InstanceState.PREEMPTING
        recommended = old is not None and old.state == InstanceState.RUNNING and old.job.spare_on_rebalance
        if not (noticed or recommended) or old.job.status != JobStatus.RUNNING:
            if old is not None:
                end_notice_hold(old.pk)
            if old is not None and old.state == InstanceState.ENDED:
                log_job_event(old.job_id, f"no spare for instance {old.pk}: its VM had already ended when its "
                                          "notice was handled; the job recovers as usual")
            return []
        job = old.job
        nodes = list(training_nodes(job.pk).order_by("rank"))
        spares = Instance.objects.filter(standby_for__in=nodes)
        if spares.exists():  # one spare a node: a resent nudge, or a notice after a recommendation's or a peer's
            if noticed and spares.filter(state__in=InstanceState.LIVE).exists():
                _hold_for_spare(old)  # its notice waits for those spares too
            else:
                end_notice_hold(old.pk)
            return []
        where = _spare_placement(job, old, len(nodes))
        if isinstance(where, str):
            log_job_event(job.pk, f"no spare for instance {old.pk}: {where}; "
                                  + ("the job recovers when it has ended" if noticed else "it trains on"))
            end_notice_hold(old.pk)
            return []
        rendezvous = gang_rendezvous(job, where.placement)
        spare_ids = [_new_instance(job, node.rank, where, rendezvous, standby_for=node) for node in nodes]
        if noticed:
            _hold_for_spare(old)
        p = where.placement
        log_job_event(job.pk, f"spare instance{'s' if len(spare_ids) > 1 else ''} "
                              f"{', '.join(map(str, spare_ids))} launching on {p.provider} {p.zone} {p.instance_type} "
                              f"({p.market}, ${where.usd_per_hour}/h) during the "
                              f"{'notice' if noticed else 'rebalance recommendation'} of instance {old.pk}")
        transaction.on_commit(lambda: _enqueue_launches(spare_ids))
    return spare_ids


def _hold_for_spare(old: Instance) -> None:
    """Tell a noticed VM a spare is coming (`hold`: train on until it is ready), unless the
    spare is ready already and has told it to save and stop."""
    Instance.objects.filter(pk=old.pk, state__in=InstanceState.LIVE).exclude(
        requested_action=Action.CHECKPOINT_AND_STOP).update(requested_action=Action.HOLD,
                                                            requested_action_at=timezone.now())


def _spare_placement(job: Job, old: Instance, count: int) -> str | placements.PricedPlacement:
    """Where `count` spares go, or why none is launched."""
    no_room = _no_gpu_room(job, count, "beside the noticed VM")
    if no_room:
        return no_room
    choice = placements.choose(job, leaving=old)
    if choice.chosen is None:
        return choice.reason
    over_budget = budget.hold_reason(job.team, budget.job_remaining_cost(choice.chosen.usd_per_hour, job, count))
    return over_budget or choice.chosen


def _no_gpu_room(job: Job, count: int, beside: str) -> str:
    """Why `count` more VMs of the job do not fit the GPU limits now, or ""."""
    wanted = job.accelerator_count * count
    team_limit, deployment_limit = job.team.max_concurrent_gpus, settings.RESPAWN["MAX_CONCURRENT_GPUS"]
    if team_limit is not None and gpus_in_use(job.team_id) + wanted > team_limit:
        return f"the team GPU limit ({team_limit}) has no room for it {beside}"
    if deployment_limit is not None and gpus_in_use() + wanted > deployment_limit:
        return f"the deployment GPU limit ({deployment_limit}) has no room for it {beside}"
    return ""


def grow_elastic_gangs() -> int:
    """Elastic gangs below their full size try to grow back (docs/elastic.md): GROW_RETRY_S
    after they shrank or after their last try, joiners for the missing nodes are launched
    where the gang trains (its nodes talk to each other every step), within the GPU limits
    and the budget. Each boots and prepares, then stands by; once all are ready the gang is
    asked for a checkpoint and regroups with them at its commit (services.grow_with_joiners).
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
            ids = [_new_instance(job, rank, where, nodes[0].rendezvous_addr, joining=True,
                                 generation=nodes[0].gang_generation) for rank in range(len(nodes), job.nodes)]
            p = where.placement
            log_job_event(job.pk, f"joiner instance{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))} launching "
                                  f"on {p.provider} {p.zone} {p.instance_type} ({p.market}, ${where.usd_per_hour}/h) "
                                  f"to grow the gang from {len(nodes)} to {job.nodes} nodes")
            transaction.on_commit(lambda ids=ids: _enqueue_launches(ids))
            launched += ids
    return len(launched)


def _grow_placement(job: Job, rank0: Instance, count: int, now) -> str | placements.PricedPlacement:
    """Where `count` joiners go: beside the gang's rank 0, at today's price; or why none."""
    no_room = _no_gpu_room(job, count, "beside the gang")
    if no_room:
        return no_room
    here = Placement(provider=rank0.provider, region=rank0.region, zone=rank0.zone,
                     instance_type=rank0.instance_type, market=rank0.market)
    priced = next((p for p in placements.priced_placements(job, rank0.market, now) if p.placement == here), None)
    if priced is None:
        return f"{rank0.provider} {rank0.zone} {rank0.instance_type} ({rank0.market}) has no price now"
    return budget.hold_reason(job.team, budget.job_remaining_cost(priced.usd_per_hour, job, count)) or priced


def release_stale_spares() -> int:
    """A spare whose instance still runs one heartbeat timeout past its notice's deadline
    stood by for a notice that turned out false and an agent that did not stop; one
    launched on a rebalance recommendation (no notice) whose instance still runs a save
    budget and a heartbeat timeout after it was told to stop has an agent that did not
    stop either (so has a gang's node without a notice, told to stop once its spares were
    ready). Released, with the rest of a gang's; the instance keeps its slot
    (docs/spares.md). Returns how many were released."""
    grace = timedelta(seconds=settings.RESPAWN["HEARTBEAT_TIMEOUT_S"])
    save_budget = timedelta(seconds=settings.RESPAWN["NOTICE_BUDGET_S"])
    released = 0
    spares = Instance.objects.filter(state__in=InstanceState.LIVE, standby_for__state__in=InstanceState.LIVE)
    for spare in spares.select_related("standby_for")[: settings.RESPAWN["RECONCILE_BATCH"]]:
        old = spare.standby_for
        notices = old.interruptions.filter(kind=InterruptionKind.NOTICE)
        deadline = notices.exclude(deadline=None).order_by("-deadline").values_list("deadline", flat=True).first()
        told_to_stop = old.requested_action_at if old.requested_action == Action.CHECKPOINT_AND_STOP else None
        if deadline is not None and timezone.now() > deadline + grace:
            why = f"instance {old.pk} still ran past its notice's deadline (a false notice)"
        elif not notices.exists() and told_to_stop and timezone.now() > told_to_stop + save_budget + grace:
            why = f"instance {old.pk} did not stop when its spare was ready"
        else:
            continue
        with transaction.atomic():
            released += release_spares(spare.job_id, why)
    return released


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
        instance_id = _new_instance(job, 0, chosen, "", purpose=Purpose.POST)
        p = chosen.placement
        log_job_event(job.pk, f"post step: launching instance {instance_id} on {p.provider} {p.zone} "
                              f"{p.instance_type} (on-demand, ${chosen.usd_per_hour}/h)")
        transaction.on_commit(lambda: _enqueue_launches([instance_id]))
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


def _enqueue_launches(instance_ids: list[int]) -> None:
    for instance_id in instance_ids:
        nudges.send(nudges.LAUNCH_INSTANCE, instance_id)


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
        if instance.joining:  # the gang trains on at its size (services._after_joiner_ended)
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


def confirm_silent(instance: Instance) -> None:
    """The heartbeat deadline passed: ask the cloud before replacing the VM. Gone
    means preempted, and so does stopped (an eviction that keeps the VM, e.g. Azure's
    Deallocate: `release_stopped_disks` deletes it); still there means lost, and it is
    terminated first (fencing).

    Not before a notice's deadline: a VM saving its notice checkpoint may heartbeat late
    (a busy or slow VM), and terminating it would kill the very save the spare waits for;
    the cloud reclaims it at the deadline anyway, and then it is asked again."""
    notice_deadline = _pending_notice_deadline(instance)
    if notice_deadline is not None:
        Instance.objects.filter(pk=instance.pk, heartbeat_deadline__lt=notice_deadline).update(
            heartbeat_deadline=notice_deadline)
        log.info("instance %s of job %s is silent within its notice window: asked again at its deadline %s",
                 instance.pk, instance.job_id, notice_deadline.isoformat())
        return
    if not instance.provider_instance_id:  # never heard of a VM: nothing to ask or fence
        mark_lost(instance)
        return
    cloud = provider_for(instance.provider, instance.region)
    state = cloud.describe(instance.provider_instance_id).state
    if state in (CloudState.GONE, CloudState.STOPPED):
        _end_gone(instance, f"heartbeat deadline passed; the cloud says {state}", deleted=state == CloudState.GONE)
    else:
        cloud.terminate(instance.provider_instance_id)
        mark_lost(instance)
    nudge_schedule()


# The longest window a cloud gives a spot VM between its notice and the reclaim (AWS's
# two minutes): the deadline a VM reports is its word, so a silent VM is spared no longer.
LONGEST_NOTICE = timedelta(minutes=2)


def _pending_notice_deadline(instance: Instance):
    """The deadline of a preemption notice of the instance that has not yet passed, if
    any, at most LONGEST_NOTICE after the notice reached the control plane."""
    if instance.state != InstanceState.PREEMPTING:
        return None
    now = timezone.now()
    bounds = [min(deadline, received + LONGEST_NOTICE) for deadline, received in instance.interruptions.filter(
        kind=InterruptionKind.NOTICE, deadline__gt=now).values_list("deadline", "received_at")]
    return max((b for b in bounds if b > now), default=None)


def _end_gone(instance: Instance, message: str, *, deleted: bool = True) -> None:
    """End an instance the cloud evicted; `deleted`: its VM is gone, so a disk it kept
    (a stopped disk) bills no more either."""
    with transaction.atomic():
        if end_instance(instance, EndReason.PREEMPTED, message=message):
            Instance.objects.filter(pk=instance.pk).update(preemption_confirmed=True)  # the cloud's own word
            if deleted:
                Instance.objects.filter(pk=instance.pk).exclude(stopped_disk_sku="").update(
                    storage_released_at=F("ended_at"))
            InterruptionEvent.objects.create(instance=instance, kind=InterruptionKind.PREEMPTED,
                                             source="provider_api", checkpoint_saved=False)
            went_on = after_instance_ended(instance.job_id, EndReason.PREEMPTED, instance_id=instance.pk)
            if not went_on and instance.standby_for_id is None and not instance.interruptions.filter(
                    kind=InterruptionKind.NOTICE).exists():
                # Gone without a notice: no collective save can succeed without it, so the
                # rest of its gang stops at once (from their newest committed checkpoint).
                request_action(instance.job_id, Action.STOP)


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


def check_gang_failure(job_id: int, signature: str, output_tail: str, instance_id: int | None = None) -> None:
    """A rank of a gang failed while its peers still counted as live. A peer whose VM
    the cloud says is gone was preempted, and the failure followed from it; else the
    failure is the code's. Either way the job moves on only from where it was (an
    interruption found meanwhile has already moved it), and a judgement that arrives
    after the gang was already replaced is dropped: it is about an older generation."""
    failed = Instance.objects.filter(pk=instance_id).first() if instance_id is not None else None
    if failed and Instance.objects.filter(job_id=job_id, rank=failed.rank, pk__gt=failed.pk).exists():
        return  # its slot already has a replacement
    for peer in Instance.objects.filter(job_id=job_id, state__in=InstanceState.LIVE).exclude(provider_instance_id=""):
        if provider_for(peer.provider, peer.region).describe(peer.provider_instance_id).state == CloudState.GONE:
            _end_gone(peer, "another rank of its gang failed; the cloud says this VM is gone")
            nudge_schedule()
            return
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.status in (JobStatus.RUNNING, JobStatus.PROVISIONING):
            judge_failure(job, signature, output_tail)


def check_elastic_gang(job_id: int) -> None:
    """A node of an elastic gang said its trainer exited (services.trainer_exited). Peers
    whose VM the cloud says is gone (or stopped) were preempted: each ends so, and the
    gang goes on without them (services.go_on_with_survivors). With none gone the exit
    was the code's: the gang is told to stop, and its nodes' exit reports (the failed
    one's code and output) are judged as any gang's; the job's events say so when the
    gang had shrunk and its trainers failed before a step in the new shape."""
    nodes = training_nodes(job_id).select_related("resume_checkpoint")
    if not nodes.filter(trainer_exited_at__isnull=False).exists():
        return  # regrouped meanwhile
    gone = False
    for peer in nodes.exclude(provider_instance_id=""):
        state = provider_for(peer.provider, peer.region).describe(peer.provider_instance_id).state
        if state in (CloudState.GONE, CloudState.STOPPED):
            _end_gone(peer, f"a node of its elastic gang lost its trainer; the cloud says this VM is {state}",
                      deleted=state == CloudState.GONE)
            gone = True
    if gone:
        nudge_schedule()
        return
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.status in (JobStatus.RUNNING, JobStatus.PROVISIONING):
            size = current_world_size(job)
            if size < job.nodes and not any(
                    node.last_step > (node.resume_checkpoint.step if node.resume_checkpoint else 0) for node in nodes):
                log_job_event(job_id, f"the gang's trainers failed before a step at its regrouped size of {size} "
                                      f"nodes: a trainer that cannot resume on {size} (a global batch not divisible by {size}, "
                                      f"say) needs a nodes_min it can; judged as the code's failure, and a "
                                      f"restart relaunches all {job.nodes} nodes")
            request_action(job_id, Action.STOP)


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


def resend_lost_launches() -> int:
    """A launch message lost with a killed worker or a restarted broker is sent again:
    `requested` instances with no VM id after a short age. Launch is idempotent (the
    provider looks the VM up by our tag first), so a slow first attempt does no harm."""
    cutoff = timezone.now() - timedelta(seconds=settings.RESPAWN["LAUNCH_RESEND_S"])
    stale = Instance.objects.filter(state=InstanceState.REQUESTED, provider_instance_id="", requested_at__lt=cutoff)
    ids = list(stale.values_list("pk", flat=True)[: settings.RESPAWN["RECONCILE_BATCH"]])
    transaction.on_commit(lambda: _enqueue_launches(ids))
    return len(ids)


def retry_stuck_provisioning() -> int:
    """Instances that never registered within the provisioning timeout are fenced
    and their job re-placed. One whose agent did reach us, but whose registers the
    server failed to answer until it gave up, says nothing about capacity: its job
    fails with cause `setup`, as it would have at the next failure."""
    cutoff = timezone.now() - timedelta(seconds=settings.RESPAWN["PROVISION_TIMEOUT_S"])
    stuck = Instance.objects.filter(state__in=(InstanceState.REQUESTED, InstanceState.BOOTING), requested_at__lt=cutoff)
    count = 0
    for instance in stuck[: settings.RESPAWN["RECONCILE_BATCH"]]:
        if instance.provider_instance_id:
            provider_for(instance.provider, instance.region).terminate(instance.provider_instance_id)
        with transaction.atomic():
            if instance.register_failures:
                give_up_registering(instance, f"never registered: the control plane failed to answer its "
                                              f"{instance.register_failures} register(s) until its agent gave up")
            elif end_instance(instance, EndReason.CAPACITY_ERROR, message="never registered: provisioning timed out"):
                after_instance_ended(instance.job_id, EndReason.CAPACITY_ERROR, instance_id=instance.pk)
                count += 1
    if count:
        nudge_schedule()
    return count
