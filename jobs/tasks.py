"""Celery tasks. Each takes ids, re-checks state, is safe to run twice, and
sweeps in bounded batches; the database is the truth, a message only a nudge."""

from __future__ import annotations

import logging
from datetime import timedelta

import requests
from celery import shared_task
from django.conf import settings
from django.utils import timezone

from respawn_server.jobs.core.choices import InstanceState, JobStatus
from respawn_server.jobs.core.services import heartbeat_timeout
from respawn_server.jobs.fleet import launcher, leftovers, reconciler, scheduler
from respawn_server.jobs.fleet.providers.base import TransientError
from respawn_server.jobs.models import Instance, ProcessedEvent, ServiceBeat, Team
from respawn_server.jobs.money import budget, refreshers
from respawn_server.jobs.notify import events as notify_events
from respawn_server.jobs.notify import sending
from respawn_server.jobs.recovery import joiners, spares
from respawn_server.jobs.reports.checkpoints import expire_pending_validations

log = logging.getLogger(__name__)

AGENT_API_BEAT = "agent_api"
PROCESSED_EVENT_RETENTION = timedelta(days=2)


def record_api_serving(now) -> None:
    """The API answered a probe. A gap longer than a few reconcile periods since
    the last answer restarts `serving_since`."""
    gap = timedelta(seconds=3 * settings.RECONCILE_INTERVAL_S)
    beat = ServiceBeat.objects.filter(name=AGENT_API_BEAT).first()
    if beat is None or now - beat.last_seen > gap:
        ServiceBeat.objects.update_or_create(name=AGENT_API_BEAT, defaults={"last_seen": now, "serving_since": now})
    else:
        ServiceBeat.objects.filter(name=AGENT_API_BEAT).update(last_seen=now)


def probe_api() -> None:
    """Ask the agent-facing API whether it serves, the way agents reach it, and
    remember the answer (the reconciler's own observation, on its own clock)."""
    url = settings.RESPAWN["API_URL"].rstrip("/") + "/healthz"
    try:
        requests.get(url, timeout=2).raise_for_status()
    except requests.RequestException as exc:
        log.warning("control plane API at %s is not serving (%s): no instance will be marked lost", url, exc)
        return
    record_api_serving(timezone.now())


def api_served_long_enough(now) -> bool:
    beat = ServiceBeat.objects.filter(name=AGENT_API_BEAT).first()
    if beat is None:
        return False
    fresh = now - beat.last_seen <= timedelta(seconds=3 * settings.RECONCILE_INTERVAL_S)
    return fresh and now - beat.serving_since >= heartbeat_timeout()


# Cloud calls that fail transiently (throttling, 5xx) are retried with back-off.
CLOUD_RETRY = dict(autoretry_for=(TransientError,), retry_backoff=1, retry_backoff_max=60, max_retries=8,
                   retry_jitter=True)


@shared_task(name="respawn_server.jobs.tasks.schedule", ignore_result=True)
def schedule() -> int:
    return len(scheduler.schedule())


@shared_task(name="respawn_server.jobs.tasks.launch_instance", ignore_result=True, **CLOUD_RETRY)
def launch_instance(instance_id: int) -> None:
    launcher.launch(instance_id)


@shared_task(name="respawn_server.jobs.tasks.terminate_instance", ignore_result=True, **CLOUD_RETRY)
def terminate_instance(instance_id: int) -> None:
    launcher.terminate(instance_id)


@shared_task(name="respawn_server.jobs.tasks.run_drill", ignore_result=True, **CLOUD_RETRY)
def run_drill(drill_id: int) -> None:
    from respawn_server.jobs.drills.services import run_drill as interrupt_for_drill

    interrupt_for_drill(drill_id)


@shared_task(name="respawn_server.jobs.tasks.launch_spare", ignore_result=True)
def launch_spare(instance_id: int) -> None:
    spares.launch_spare(instance_id)


@shared_task(name="respawn_server.jobs.tasks.check_gang_failure", ignore_result=True, **CLOUD_RETRY)
def check_gang_failure(job_id: int, signature: str, output_tail: str, instance_id: int | None = None) -> None:
    reconciler.check_gang_failure(job_id, signature, output_tail, instance_id)


@shared_task(name="respawn_server.jobs.tasks.check_elastic_gang", ignore_result=True, **CLOUD_RETRY)
def check_elastic_gang(job_id: int) -> None:
    reconciler.check_elastic_gang(job_id)


@shared_task(name="respawn_server.jobs.tasks.reconcile", ignore_result=True)
def reconcile() -> int:
    """The safety net, in bounded batches: silent instances confirmed with the
    cloud (gone or stopped: preempted; still there: terminated and lost), evicted
    VMs that kept a billed disk deleted and their release recorded, provisioning
    stuck past its timeout retried, VMs tagged by us that the database does not know
    terminated, and anything a lost broker message left behind scheduled again.

    Silent instances only while the API has served a full heartbeat timeout:
    agents could not reach it before, so their silence says nothing (DESIGN §4)."""
    probe_api()
    now = timezone.now()
    handled = 0
    if api_served_long_enough(now):
        overdue = (
            Instance.objects.select_related("job")
            .filter(state__in=InstanceState.LIVE, heartbeat_deadline__lt=now)
            .order_by("heartbeat_deadline")[: settings.RESPAWN["RECONCILE_BATCH"]]
        )
        for instance in overdue:
            reconciler.confirm_silent(instance)
            handled += 1
    handled += reconciler.retry_stuck_provisioning()
    spares.release_stale_spares()
    joiners.grow_elastic_gangs()
    leftovers.release_stopped_disks()
    reconciler.resend_lost_launches()
    expire_pending_validations(now, settings.RESPAWN["RECONCILE_BATCH"])
    for team in Team.objects.exclude(monthly_budget_usd=None).filter(jobs__status__in=JobStatus.ACTIVE).distinct():
        budget.warn_over_budget(team)
    notify_events.sweep(now)
    leftovers.reap_orphans()
    scheduler.schedule()
    ProcessedEvent.objects.filter(received_at__lt=now - PROCESSED_EVENT_RETENTION).delete()
    return handled


# A webhook or mail server that fails is tried again with growing pauses, then given up.
NOTIFY_RETRY = dict(autoretry_for=(sending.DeliveryFailed,), retry_backoff=settings.NOTIFY["BACKOFF_S"],
                    retry_backoff_max=settings.NOTIFY["BACKOFF_MAX_S"], max_retries=settings.NOTIFY["MAX_RETRIES"],
                    retry_jitter=True)


@shared_task(name="respawn_server.jobs.tasks.deliver_notification", bind=True, ignore_result=True, **NOTIFY_RETRY)
def deliver_notification(self, delivery_id: int) -> None:
    sending.attempt(delivery_id, last=self.request.retries >= self.max_retries)


@shared_task(name="respawn_server.jobs.tasks.refresh_prices", ignore_result=True)
def refresh_prices(provider: str) -> int:
    """Fetch one cloud's current prices; returns how many quotes were new. Safe to
    run twice: a quote already stored is not stored again."""
    return refreshers.refresh(provider).added
