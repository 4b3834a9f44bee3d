"""Turning queued and recovering jobs into placed ones: which job goes first, the
limits and the budget it waits for, and its gang's Instance rows.

Everything here runs in Celery workers (the web process only records intent).
Each step re-reads the rows it acts on and is safe to run twice: an Instance row
with its client token exists before any cloud call, so a worker dying mid-call
leaves a row the next attempt (or the reconciler) finds, and providers look a VM
up by our tag before making another."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from respawn_server.jobs.core.choices import FailureCause, InstanceState, JobStatus
from respawn_server.jobs.core.signals import launch_held
from respawn_server.jobs.core.transitions import transition_job
from respawn_server.jobs.fleet import placement as placements
from respawn_server.jobs.fleet.instances import enqueue_launches, gpus_in_use, new_instance
from respawn_server.jobs.fleet.post_steps import start_post_steps
from respawn_server.jobs.models import Job, WorldSize
from respawn_server.jobs.money import budget
from respawn_server.jobs.recovery.gangs import gang_rendezvous


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
        ids = [new_instance(job, rank, chosen, rendezvous) for rank in range(job.nodes)]
        WorldSize.objects.create(job=job, world_size=job.nodes, reason=f"{job.nodes} node(s) placed")
        transaction.on_commit(lambda: enqueue_launches(ids))
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
