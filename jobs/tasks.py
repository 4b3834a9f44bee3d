"""Celery tasks. Each takes ids, re-checks state, is safe to run twice, and
sweeps in bounded batches; the database is the truth, a message only a nudge."""

from __future__ import annotations

import logging
from datetime import timedelta

import requests
from celery import shared_task
from django.conf import settings
from django.utils import timezone

from jobs.choices import InstanceState
from jobs.models import Instance, ProcessedEvent, ServiceBeat
from jobs.services import heartbeat_timeout, mark_lost

log = logging.getLogger(__name__)

AGENT_API_BEAT = "agent_api"
PROCESSED_EVENT_RETENTION = timedelta(days=2)


def record_api_serving(now=None) -> None:
    """Called whenever the API answers a health probe. A gap longer than a few
    reconcile periods restarts `serving_since`."""
    now = now or timezone.now()
    gap = timedelta(seconds=3 * settings.RECONCILE_INTERVAL_S)
    beat = ServiceBeat.objects.filter(name=AGENT_API_BEAT).first()
    if beat is None or now - beat.last_seen > gap:
        ServiceBeat.objects.update_or_create(name=AGENT_API_BEAT, defaults={"last_seen": now, "serving_since": now})
    else:
        ServiceBeat.objects.filter(name=AGENT_API_BEAT).update(last_seen=now)


def probe_api() -> None:
    """Ask the agent-facing API whether it serves, the way agents reach it."""
    url = settings.RESPAWN["API_URL"].rstrip("/") + "/healthz"
    try:
        requests.get(url, timeout=2).raise_for_status()
    except requests.RequestException as exc:
        log.warning("control plane API at %s is not serving (%s): no instance will be marked lost", url, exc)


def api_served_long_enough(now) -> bool:
    beat = ServiceBeat.objects.filter(name=AGENT_API_BEAT).first()
    if beat is None:
        return False
    fresh = now - beat.last_seen <= timedelta(seconds=3 * settings.RECONCILE_INTERVAL_S)
    return fresh and now - beat.serving_since >= heartbeat_timeout()


@shared_task(name="jobs.tasks.reconcile", ignore_result=True)
def reconcile() -> int:
    """Mark instances whose heartbeat deadline passed as lost, oldest first.

    Not while the API itself has been down recently: agents could not reach it,
    so their silence says nothing about the VMs (DESIGN §4)."""
    probe_api()
    now = timezone.now()
    if not api_served_long_enough(now):
        return 0
    overdue = (
        Instance.objects.select_related("job")
        .filter(state__in=InstanceState.LIVE, heartbeat_deadline__lt=now)
        .order_by("heartbeat_deadline")[: settings.RESPAWN["RECONCILE_BATCH"]]
    )
    lost = sum(mark_lost(instance) for instance in overdue)
    ProcessedEvent.objects.filter(received_at__lt=now - PROCESSED_EVENT_RETENTION).delete()
    return lost
