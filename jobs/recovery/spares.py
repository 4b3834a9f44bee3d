"""Spares (docs/spares.md): launched on a notice or a rebalance recommendation, ready,
promoted once the instances they stand by for have ended, or released."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from respawn.protocol import Action
from respawn_server.jobs.core.choices import InstanceState, InterruptionKind, JobStatus
from respawn_server.jobs.core.services import fence, usable_checkpoint
from respawn_server.jobs.core.transitions import log_job_event, transition_job
from respawn_server.jobs.fleet import placement as placements
from respawn_server.jobs.fleet.instances import enqueue_launches, new_instance, no_gpu_room
from respawn_server.jobs.models import Instance, Job
from respawn_server.jobs.money import budget
from respawn_server.jobs.recovery.counting import counts_as_preemption
from respawn_server.jobs.recovery.gangs import gang_rendezvous, training_nodes


def launch_spare(instance_id: int) -> list[int]:
    """A notice came for this instance (it is preempting), or a rebalance recommendation
    for a job with spare_on_rebalance (it is still running): place and launch its
    replacement now, as a spare (docs/spares.md) that boots and prepares meanwhile and
    trains once the instance has ended (respawn_server.jobs.recovery.spares.promote_spares). In a gang,
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
        spare_ids = [new_instance(job, node.rank, where, rendezvous, standby_for=node) for node in nodes]
        if noticed:
            _hold_for_spare(old)
        p = where.placement
        log_job_event(job.pk, f"spare instance{'s' if len(spare_ids) > 1 else ''} "
                              f"{', '.join(map(str, spare_ids))} launching on {p.provider} {p.zone} {p.instance_type} "
                              f"({p.market}, ${where.usd_per_hour}/h) during the "
                              f"{'notice' if noticed else 'rebalance recommendation'} of instance {old.pk}")
        transaction.on_commit(lambda: enqueue_launches(spare_ids))
    return spare_ids


def _hold_for_spare(old: Instance) -> None:
    """Tell a noticed VM a spare is coming (`hold`: train on until it is ready), unless the
    spare is ready already and has told it to save and stop."""
    Instance.objects.filter(pk=old.pk, state__in=InstanceState.LIVE).exclude(
        requested_action=Action.CHECKPOINT_AND_STOP).update(requested_action=Action.HOLD,
                                                            requested_action_at=timezone.now())


def _spare_placement(job: Job, old: Instance, count: int) -> str | placements.PricedPlacement:
    """Where `count` spares go, or why none is launched."""
    no_room = no_gpu_room(job, count, "beside the noticed VM")
    if no_room:
        return no_room
    choice = placements.choose(job, leaving=old)
    if choice.chosen is None:
        return choice.reason
    over_budget = budget.hold_reason(job.team, budget.job_remaining_cost(choice.chosen.usd_per_hour, job, count))
    return over_budget or choice.chosen


def end_notice_hold(instance_id: int, *, spare_ready: bool = False) -> None:
    """A VM trains on while its spare boots (a noticed one, JobSpec.notice_hold, or one told
    of a rebalance), and so does the rest of its gang: tell them to save and stop now,
    because the spares are ready, or, for a noticed one only, because none is coming
    (without a notice it just trains on). A gang saves and stops together."""
    held = Instance.objects.filter(pk=instance_id).select_related("job").first()
    if held is None:
        return
    nodes = training_nodes(held.job_id) if held.job.nodes > 1 else Instance.objects.filter(
        pk=held.pk, state__in=InstanceState.LIVE)
    if spare_ready:
        # Ready spares end the hold of the nodes they stand by for, and of no others: once
        # promoted, the spares are the gang's nodes, and a readiness read before (a standby
        # poll in flight at the promotion) must not stop the gang they now are.
        nodes = nodes.filter(spares__state__in=InstanceState.LIVE)
    elif not nodes.filter(state=InstanceState.PREEMPTING).exists():
        return
    nodes.exclude(requested_action=Action.CHECKPOINT_AND_STOP).update(requested_action=Action.CHECKPOINT_AND_STOP,
                                                                      requested_action_at=timezone.now())


def spare_ready(spare: Instance) -> None:
    """A spare, booted and prepared, asked whether it may train. Once every spare of the
    job is ready, the instances they stand by for are told to save and stop: a gang hands
    over whole, never with a node slot waiting on a spare still booting. (Two spares asking
    at once may each miss the other's mark; they ask again in half a second.)"""
    Instance.objects.filter(pk=spare.pk, standby_ready_at__isnull=True).update(standby_ready_at=timezone.now())
    if not Instance.objects.filter(job_id=spare.job_id, state__in=InstanceState.LIVE, standby_for__isnull=False,
                                   standby_ready_at__isnull=True).exists():
        end_notice_hold(spare.standby_for_id, spare_ready=True)


def promote_spares(job: Job, spares: list[Instance]) -> None:
    """Every instance the job's spares stood by for has ended (stopped after the notice
    save, or gone): each spare takes its node slot now, all resuming from the newest usable
    checkpoint, which their agents read from `standby`. One interruption, counted once
    when a VM was reclaimed or lost (a planned move is not a preemption). The job passes
    through recovering and provisioning as any relaunch does (the table of DESIGN §4), and
    is running again at once when every spare has registered. Clearing standby_for while
    an old instance still lived would break the one-live-instance-per-slot constraint."""
    resume = usable_checkpoint(job)
    olds = [spare.standby_for for spare in spares]
    ids = [spare.pk for spare in spares]
    # A spare registering now holds its row until it commits, having read itself standing by
    # (no resume point fixed): the first update waits for it and takes every spare's row, so a
    # registration begun after reads itself promoted and fixes its own; the second then sees
    # the committed state (a stale read left a registered spare's job provisioning). In the
    # other order a spare mid-registration, booting in the first's snapshot, was skipped and
    # kept no resume point (CI's drill).
    Instance.objects.filter(pk__in=ids).update(standby_for=None)
    Instance.objects.filter(pk__in=ids, state=InstanceState.RUNNING).update(
        resume_checkpoint=resume, last_step=resume.step if resume else 0)
    interrupted = any(counts_as_preemption(old.end_reason, old.pk) for old in olds)
    counted = {"preemptions": F("preemptions") + 1} if interrupted else {}
    transition_job(job.pk, job.status, JobStatus.RECOVERING,
                   message=", ".join(f"instance {old.pk} {old.end_reason}" for old in olds), **counted)
    names = ", ".join(str(spare.pk) for spare in spares)
    transition_job(job.pk, JobStatus.RECOVERING, JobStatus.PROVISIONING,
                   message=f"spare instance{'s' if len(spares) > 1 else ''} {names}, launched on the notice, "
                           f"take{'' if len(spares) > 1 else 's'} over" + (f" from step {resume.step}" if resume else ""))
    if not Instance.objects.filter(pk__in=ids).exclude(state=InstanceState.RUNNING).exists():
        transition_job(job.pk, JobStatus.PROVISIONING, JobStatus.RUNNING, message="the spares had registered")
    for spare, old in zip(spares, olds):
        log_job_event(job.pk, f"spare instance {spare.pk} promoted; {overlap_words(spare, old.ended_at)}")


def overlap_words(spare: Instance, until) -> str:
    """The price of a spare's overlap with the instance it stood by for, in words: the
    ledger bills the spare from its launch like any instance (its waiting is boot time, no
    kept work, so the savings baseline gains nothing from it); this names that share."""
    seconds = max(0.0, (until - spare.requested_at).total_seconds())
    price = spare.price_per_hour_at_launch
    cost = f", about ${price * Decimal(seconds) / 3600:.4f} at ${price}/h" if price is not None else ""
    return f"it ran {seconds:.0f}s beside instance {spare.standby_for_id}{cost}: the price of the overlap"


def release_spares(job_id: int, why: str) -> int:
    """End the job's spares, which will not be needed, and terminate their VMs. A gang's
    go together: a gang hands over whole or not at all. Returns how many ended."""
    spares = fence(Instance.objects.filter(job_id=job_id, state__in=InstanceState.LIVE, standby_for__isnull=False),
                   f"spare released: {why}")
    for spare in spares:
        log_job_event(job_id, f"spare instance {spare.pk} released ({why}); "
                              f"{overlap_words(spare, spare.ended_at or timezone.now())}")
    return len(spares)


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
