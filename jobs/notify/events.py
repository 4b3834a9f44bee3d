"""Happenings become rows: one Notification (its `key` names the happening, so a
resend is the same row) and one Delivery per matching subscription, written in the
transaction of the happening and sent by a worker after it commits (DESIGN §11).

The signal receivers here are the only notification work on the hot paths: with no
matching subscription they write nothing, and they never call out."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from respawn_server.jobs.core import nudges
from respawn_server.jobs.core.choices import EndReason, FailureCause, JobStatus
from respawn_server.jobs.core.choices import NotificationKind as Kind
from respawn_server.jobs.core.signals import budget_warning, checkpoint_invalid, job_status_changed, launch_held
from respawn_server.jobs.fleet.placement import deadline_slack_s
from respawn_server.jobs.models import Delivery, Instance, Job, JobEvent, Notification, Subscription, failure_headline

log = logging.getLogger(__name__)

LOG_TAIL_CHARS = 3000  # of a failed job's output, in its notification
BURST_WINDOW = timedelta(hours=1)
INTERRUPTED = (EndReason.PREEMPTED, EndReason.LOST)


def matching(team_id: int, kind: str, *, owner_id: int | None = None,
             when: Callable[[Subscription], bool] = lambda sub: True) -> list[Subscription]:
    """The team's enabled subscriptions to `kind`: the team's own, and those of its members
    who own the job (`owner_id`; None: a happening of the whole team, told to every member's)."""
    people = Q(user__memberships__team_id=team_id) if owner_id is None else Q(user_id=owner_id,
                                                                               user__memberships__team_id=team_id)
    # The text match narrows in SQL (on both databases) what the exact test then decides.
    found = Subscription.objects.filter(Q(user=None) | people, team_id=team_id, enabled=True,
                                        events__icontains=f'"{kind}"')
    return [sub for sub in found if kind in sub.events and when(sub)]


def notify(subscriptions: list[Subscription], *, team_id: int, kind: str, key: str, title: str, text: str = "",
           job_id: int | None = None, details: dict | None = None) -> Notification | None:
    """Record the happening `key` for `subscriptions` (none: nothing is written). Each
    (notification, subscription) pair is delivered once: a pair recorded before, by
    this process or a concurrent one, is not sent again. Never raises into the
    caller's transaction: a notification must not undo what it tells of."""
    if not subscriptions:
        return None
    try:
        with transaction.atomic():
            notification, _ = Notification.objects.get_or_create(key=key, defaults=dict(
                team_id=team_id, job_id=job_id, kind=kind, title=title[:300], text=text, details=details or {}))
            new = _new_deliveries(notification, subscriptions)
    except DatabaseError:
        log.exception("notification %s not recorded", key)
        return None
    for delivery_id in new:
        nudges.send_on_commit(nudges.DELIVER_NOTIFICATION, delivery_id)
    return notification


def _new_deliveries(notification: Notification, subscriptions: list[Subscription]) -> list[int]:
    have = set(Delivery.objects.filter(notification=notification).values_list("subscription_id", flat=True))
    wanted = [Delivery(notification=notification, subscription=sub) for sub in subscriptions if sub.pk not in have]
    try:
        with transaction.atomic():
            return [d.pk for d in Delivery.objects.bulk_create(wanted)]
    except IntegrityError:
        pass  # a concurrent transaction recorded some of them: one at a time, the rest
    created = []
    for delivery in wanted:
        try:
            with transaction.atomic():
                delivery.save(force_insert=True)
            created.append(delivery.pk)
        except IntegrityError:
            continue
    return created


def job_url(job_id: int) -> str:
    return f"{settings.RESPAWN['API_URL'].rstrip('/')}/jobs/{job_id}/"


def job_details(job: Job, **more) -> dict:
    return {"job": {"id": job.pk, "name": job.name, "status": job.status, "url": job_url(job.pk),
                    "owner": job.owner.username}, "team": {"id": job.team_id, "name": job.team.name}, **more}


def job_ended(job_id: int, new: str) -> None:
    kind = Kind.JOB_SUCCEEDED if new == JobStatus.SUCCEEDED else Kind.JOB_FAILED
    job = Job.objects.select_related("team", "owner").get(pk=job_id)
    subscriptions = matching(job.team_id, kind, owner_id=job.owner_id)
    if not subscriptions:
        return
    if kind == Kind.JOB_SUCCEEDED:
        title = f"Job {job.name} (#{job.pk}) succeeded"
        text = f"{title} at step {job.last_step}." + (f" Artifact: {job.artifact_uri}" if job.artifact_uri else "")
        details = job_details(job, last_step=job.last_step, artifact_uri=job.artifact_uri)
    else:
        cause = FailureCause.LABELS.get(job.failure_cause, job.failure_cause or "unknown cause")
        headline = failure_headline(job.failure_message)
        tail = job.failure_message.partition("\n")[2][-LOG_TAIL_CHARS:]
        title = f"Job {job.name} (#{job.pk}) failed: {cause}"
        text = "\n".join(part for part in (title, headline, tail and f"Last output:\n{tail}") if part)
        details = job_details(job, cause=job.failure_cause, cause_label=cause, headline=headline, log_tail=tail)
    notify(subscriptions, team_id=job.team_id, kind=kind, key=f"{kind}:{job.pk}", title=title, text=text,
           job_id=job.pk, details=details)


def preemption_burst(job_id: int) -> None:
    """A subscription asking for N preemptions within an hour is told when the N-th comes
    (once: the next ones in the same burst count past N)."""
    job = Job.objects.select_related("team", "owner").get(pk=job_id)
    recent = list(Instance.objects.filter(job_id=job_id, end_reason__in=INTERRUPTED,
                                          ended_at__gte=timezone.now() - BURST_WINDOW).values_list("pk", flat=True))
    subscriptions = matching(job.team_id, Kind.PREEMPTION_BURST, owner_id=job.owner_id,
                             when=lambda sub: sub.preemption_burst == len(recent))
    title = f"Job {job.name} (#{job.pk}): {len(recent)} preemptions within the last hour"
    notify(subscriptions, team_id=job.team_id, kind=Kind.PREEMPTION_BURST,
           key=f"{Kind.PREEMPTION_BURST}:{job.pk}:{max(recent, default=0)}", title=title,
           text=f"{title}; it is recovering (preempted {job.preemptions} times in all).", job_id=job.pk,
           details=job_details(job, preemptions_last_hour=len(recent), preemptions=job.preemptions))


def on_job_status_changed(sender, *, job_id: int, new: str, fields: dict, **kwargs) -> None:
    if new in (JobStatus.SUCCEEDED, JobStatus.FAILED):
        job_ended(job_id, new)
    elif new == JobStatus.RECOVERING and "preemptions" in fields:
        preemption_burst(job_id)


def on_checkpoint_invalid(sender, *, checkpoint, **kwargs) -> None:
    job = Job.objects.select_related("team", "owner").get(pk=checkpoint.job_id)
    title = f"Job {job.name} (#{job.pk}): checkpoint at step {checkpoint.step} failed validation"
    notify(matching(job.team_id, Kind.CHECKPOINT_INVALID, owner_id=job.owner_id), team_id=job.team_id,
           kind=Kind.CHECKPOINT_INVALID, key=f"{Kind.CHECKPOINT_INVALID}:{checkpoint.pk}", title=title,
           text=f"{title}: {checkpoint.validation_message}", job_id=job.pk,
           details=job_details(job, checkpoint={"id": str(checkpoint.checkpoint_id), "step": checkpoint.step,
                                                "uri": checkpoint.uri, "message": checkpoint.validation_message}))


def on_budget_warning(sender, *, team, warning: str, **kwargs) -> None:
    title = f"Team {team.name}: budget warning"
    notify(matching(team.pk, Kind.BUDGET_WARNING), team_id=team.pk, kind=Kind.BUDGET_WARNING,
           key=f"{Kind.BUDGET_WARNING}:{team.pk}:{timezone.now().isoformat()}", title=title, text=f"{title}: {warning}",
           details={"team": {"id": team.pk, "name": team.name}, "warning": warning})


def on_launch_held(sender, *, job: Job, reason: str, **kwargs) -> None:
    title = f"Job {job.name} (#{job.pk}): launch held by the team's budget"
    # One per hold: a job held again after it ran (a relaunch) has a new count.
    key = f"{Kind.LAUNCH_HELD}:{job.pk}:{job.preemptions}:{job.failure_restarts}"
    notify(matching(job.team_id, Kind.LAUNCH_HELD, owner_id=job.owner_id), team_id=job.team_id,
           kind=Kind.LAUNCH_HELD, key=key, title=title, text=f"{title}: {reason}", job_id=job.pk,
           details=job_details(job, reason=reason))


def connect() -> None:
    """Called once from JobsConfig.ready."""
    job_status_changed.connect(on_job_status_changed, dispatch_uid="notify.job_status_changed")
    checkpoint_invalid.connect(on_checkpoint_invalid, dispatch_uid="notify.checkpoint_invalid")
    budget_warning.connect(on_budget_warning, dispatch_uid="notify.budget_warning")
    launch_held.connect(on_launch_held, dispatch_uid="notify.launch_held")


def subscribed_teams(kind: str) -> set[int]:
    return {sub.team_id for sub in Subscription.objects.filter(enabled=True, events__icontains=f'"{kind}"')
            .only("team_id", "events") if kind in sub.events}


def sweep(now=None) -> int:
    """Conditions that arise with time alone, found by the periodic reconcile: a job
    recovering longer than a subscription's threshold (told once per recovery), and a
    job whose deadline even the on-demand fallback would now miss (told once). Returns
    how many notifications were recorded."""
    now = now or timezone.now()
    batch = settings.RESPAWN["RECONCILE_BATCH"]
    recorded = 0
    recovering = Job.objects.filter(status=JobStatus.RECOVERING, team_id__in=subscribed_teams(Kind.RECOVERING_LONG))
    for job in recovering.select_related("team", "owner").order_by("updated_at")[:batch]:
        since = JobEvent.objects.filter(job=job, to_status=JobStatus.RECOVERING).order_by("-created_at", "-id").first()
        if since is None:
            continue
        waited = (now - since.created_at).total_seconds()
        title = f"Job {job.name} (#{job.pk}) has been recovering for {waited / 60:.0f} min"
        recorded += notify(
            matching(job.team_id, Kind.RECOVERING_LONG, owner_id=job.owner_id,
                     when=lambda sub: sub.recovering_after_s <= waited),
            team_id=job.team_id, kind=Kind.RECOVERING_LONG, key=f"{Kind.RECOVERING_LONG}:{job.pk}:{since.pk}",
            title=title, text=f"{title}: {job.status_reason}", job_id=job.pk,
            details=job_details(job, recovering_since=since.created_at.isoformat(), reason=job.status_reason),
        ) is not None
    dated = Job.objects.filter(deadline__isnull=False, status__in=JobStatus.ACTIVE | {JobStatus.QUEUED},
                               team_id__in=subscribed_teams(Kind.DEADLINE_AT_RISK))
    for job in dated.select_related("team", "owner").order_by("deadline")[:batch]:
        slack = deadline_slack_s(job, now)
        if slack >= 0:
            continue
        title = f"Job {job.name} (#{job.pk}): deadline at risk"
        text = (f"{title}: finishing on on-demand from now would end {-slack / 60:.0f} min after the deadline "
                f"({job.deadline.isoformat()}).")
        recorded += notify(
            matching(job.team_id, Kind.DEADLINE_AT_RISK, owner_id=job.owner_id), team_id=job.team_id,
            kind=Kind.DEADLINE_AT_RISK, key=f"{Kind.DEADLINE_AT_RISK}:{job.pk}", title=title, text=text,
            job_id=job.pk, details=job_details(job, deadline=job.deadline.isoformat(), slack_s=slack),
        ) is not None
    return recorded
