"""Prometheus `/metrics`: read from the database at scrape time.

Each scrape runs a fixed handful of aggregate queries (one per family), so its
cost does not grow with the number of jobs beyond what the database's counting
costs. Celery task failures happen in the worker process, which serves no HTTP:
the worker counts them in the shared cache (RESPAWN_CACHE_URL, Redis) and the
web process reads the counts back. Without a shared cache they stay in the
worker's memory and /metrics shows none.
"""

from __future__ import annotations

import hmac

from celery import current_app
from celery.signals import task_failure
from django.conf import settings
from django.core.cache import cache
from django.db.models import Count, Q, Sum
from django.http import HttpResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from respawn_server.jobs.core.choices import InstanceState, JobStatus

DURATION_BUCKETS_S = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
HEARTBEAT_LAG_BUCKETS_S = (5, 10, 20, 30, 60, 120, 300, 600)
TASK_FAILURE_KEY = "metrics:task_failures:{}"


def _histogram(name: str, doc: str, rows, field: str, buckets) -> HistogramMetricFamily:
    """A Prometheus histogram of `field` over the queryset `rows`, counted in one query."""
    counts = rows.aggregate(
        total=Count("pk", filter=Q(**{f"{field}__isnull": False})),
        sum=Sum(field),
        **{f"le{i}": Count("pk", filter=Q(**{f"{field}__lte": b})) for i, b in enumerate(buckets)},
    )
    cumulative = [(str(float(b)), counts[f"le{i}"]) for i, b in enumerate(buckets)]
    family = HistogramMetricFamily(name, doc, unit="seconds")
    family.add_metric([], cumulative + [("+Inf", counts["total"])], counts["sum"] or 0.0)
    return family


class RespawnCollector:
    def collect(self):
        from respawn_server.jobs.models import Checkpoint, Instance, InterruptionEvent, Job

        jobs = GaugeMetricFamily("respawn_jobs", "Jobs by state.", labels=["state"])
        by_state = dict(Job.objects.values_list("status").annotate(n=Count("pk")).values_list("status", "n"))
        for state in JobStatus.ALL:
            jobs.add_metric([state], by_state.get(state, 0))
        yield jobs

        interruptions = CounterMetricFamily("respawn_interruptions", "Interruptions recorded, by kind and source.",
                                            labels=["kind", "source"])
        by_kind = InterruptionEvent.objects.values("kind", "source").annotate(n=Count("pk")).order_by("kind", "source")
        for row in by_kind:
            interruptions.add_metric([row["kind"], row["source"]], row["n"])
        yield interruptions

        checkpoints = Checkpoint.objects.all()
        yield _histogram("respawn_checkpoint_save", "Time to persist a checkpoint.", checkpoints, "save_s",
                         DURATION_BUCKETS_S)
        yield _histogram("respawn_checkpoint_stall", "Time training waited on a checkpoint.", checkpoints, "stall_s",
                         DURATION_BUCKETS_S)

        live = Instance.objects.filter(state__in=InstanceState.LIVE, last_heartbeat_at__isnull=False)
        yield from self._heartbeat_lag(live)
        yield self._task_failures()

    def _heartbeat_lag(self, live):
        # One row per live instance: bounded by the fleet, not by history.
        now = timezone.now()
        lags = [(now - beat).total_seconds() for beat in live.values_list("last_heartbeat_at", flat=True)]
        lag_max = GaugeMetricFamily("respawn_heartbeat_lag_max_seconds",
                                    "Seconds since the stalest live instance's last heartbeat (0 with none).")
        lag_max.add_metric([], max(lags, default=0.0))
        yield lag_max
        histogram = HistogramMetricFamily("respawn_heartbeat_lag", "Seconds since each live instance's last heartbeat.",
                                          unit="seconds")
        buckets = [(str(float(b)), sum(lag <= b for lag in lags)) for b in HEARTBEAT_LAG_BUCKETS_S]
        histogram.add_metric([], buckets + [("+Inf", len(lags))], sum(lags))
        yield histogram

    def _task_failures(self):
        family = CounterMetricFamily("respawn_celery_task_failures", "Celery tasks that raised, counted by workers.",
                                     labels=["task"])
        import respawn_server.jobs.tasks  # noqa: F401  (registers our tasks, whatever this process has imported so far)

        names = sorted(name for name in current_app.tasks if not name.startswith("celery."))
        counts = cache.get_many([TASK_FAILURE_KEY.format(name) for name in names])
        for name in names:
            family.add_metric([name], counts.get(TASK_FAILURE_KEY.format(name), 0))
        return family


@task_failure.connect
def count_task_failure(sender=None, **kwargs):
    key = TASK_FAILURE_KEY.format(sender.name)
    cache.add(key, 0, timeout=None)
    cache.incr(key)


_registry = CollectorRegistry(auto_describe=False)
_registry.register(RespawnCollector())


@never_cache
def metrics_view(request):
    """Open to scrapers, or guarded by a bearer token when RESPAWN_METRICS_TOKEN is set."""
    expected = settings.RESPAWN_METRICS_TOKEN
    if expected:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {expected}".encode()):
            response = HttpResponse("metrics need 'Authorization: Bearer <RESPAWN_METRICS_TOKEN>'\n", status=401,
                                    content_type="text/plain")
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
    return HttpResponse(generate_latest(_registry), content_type=CONTENT_TYPE_LATEST)
