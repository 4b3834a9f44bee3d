"""What the dashboard pages and their JSON status views show, read in a fixed
number of queries per page whatever the number of jobs, instances or points.

Money comes from `jobs.costs` and is formatted by `jobs.api.costs`, so a figure
on a page is the API's figure."""

from __future__ import annotations

import datetime as dt
from decimal import ROUND_HALF_UP, Decimal

from django.core.cache import cache
from django.db.models import Count, Exists, F, Max, OuterRef, Q, Window
from django.db.models.functions import RowNumber
from django.urls import reverse
from django.utils import timezone

from jobs import costs
from jobs.api.costs import job_cost_data, team_month_data
from jobs.choices import InstanceState, JobStatus
from jobs.models import Checkpoint, Instance, InterruptionEvent, Job, JobEvent, LogChunk, MetricPoint, PriceQuote

JOBS_PER_PAGE = 25
LOSS_POINTS = 400
COST_POINTS = 120
LOG_LINES = 200
LOG_CHUNKS = 40  # newest chunks read for the tail; agents send bounded batches
RECENT_ROWS = 50
MARKED_CHECKPOINTS = 500
SETTLED_MONEY_TTL_S = 3600
# A team's month sums every instance billed in it; polled every few seconds by
# every open overview, it is recomputed at most this often (the API's figure is exact).
TEAM_MONEY_TTL_S = 30


def display_money(exact: str | Decimal) -> str:
    value = Decimal(exact).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
    if value == 0:
        value = abs(value)  # a few hundredths of a cent either way reads as $0.00, never $-0.00
    return f"-${-value:,.2f}" if value < 0 else f"${value:,.2f}"


def display_duration(seconds: int | None) -> str:
    if seconds is None:
        return "–"
    hours, minutes, secs = seconds // 3600, seconds % 3600 // 60, seconds % 60
    return f"{hours} h {minutes} min" if hours else f"{minutes} min {secs} s" if minutes else f"{secs} s"


def _iso(moment: dt.datetime | None) -> str | None:
    return moment.isoformat() if moment else None


# ---- jobs list --------------------------------------------------------------------------------

def filtered_jobs(team, *, statuses=(), owner="", cloud="", search=""):
    # Newest first by id (the primary key's index), reading only the columns a row shows.
    jobs = (Job.objects.filter(team=team).select_related("owner").order_by("-id")
            .only("id", "name", "status", "status_reason", "last_step", "total_steps", "preemptions", "owner__username"))
    if statuses:
        jobs = jobs.filter(status__in=statuses)
    if owner:
        jobs = jobs.filter(owner__username=owner)
    if cloud:
        jobs = jobs.filter(Exists(Instance.objects.filter(job=OuterRef("pk"), provider=cloud)))
    if search:
        jobs = jobs.filter(Q(name__icontains=search) | Q(owner__username__icontains=search))
    return jobs


def _money_of_jobs(job_ids, now) -> dict[int, costs.JobCost | str]:
    """Each job's cost, or the reason it cannot be priced (one job's missing quote
    must not blank the whole list).

    A job with no live instance has settled money: it is kept in the cache under a
    key that changes with its instances (count, newest end), its checkpoints (a
    fenced instance may still report one, with its stall) and any new price quote
    (a refresher may backfill history), so a cached figure is never stale."""
    job_ids = list(job_ids)
    keys = _settled_keys(job_ids)
    answers = cache.get_many(list(keys.values()))
    found = {job_id: answers[key] for job_id, key in keys.items() if key in answers}
    missing = [job_id for job_id in job_ids if job_id not in found]
    try:
        fresh = dict(costs.job_costs(missing, now)) if missing else {}
    except costs.CostError:
        fresh = {}
        for job_id in missing:
            try:
                fresh[job_id] = costs.job_cost(job_id, now)
            except costs.CostError as exc:
                fresh[job_id] = str(exc)
    cache.set_many({keys[job_id]: cost for job_id, cost in fresh.items() if job_id in keys}, SETTLED_MONEY_TTL_S)
    return {**found, **fresh}


def _settled_keys(job_ids) -> dict[int, str]:
    if not job_ids:
        return {}
    newest_quote = PriceQuote.objects.aggregate(newest=Max("id"))["newest"]
    rows = (Instance.objects.filter(job_id__in=job_ids).values("job_id")
            .annotate(count=Count("id", distinct=True),
                      live=Count("id", filter=Q(state__in=InstanceState.LIVE), distinct=True),
                      last_end=Max("ended_at"), last_checkpoint=Max("checkpoints__id")))
    return {row["job_id"]: f"respawn:jobcost:{row['job_id']}:{row['count']}:{row['last_end'].isoformat()}:"
                           f"{row['last_checkpoint']}:{newest_quote}"
            for row in rows if not row["live"] and row["last_end"] is not None}


def _eta_seconds(job: Job, cost) -> int | None:
    if job.status != JobStatus.RUNNING or not job.total_steps or isinstance(cost, str) or not cost.work:
        return None
    newest = max(cost.work.values(), key=lambda w: w.billed_from)
    if not newest.seconds_per_step:
        return None
    return int(max(0, job.total_steps - job.last_step) * newest.seconds_per_step)


def _money_fields(cost) -> dict:
    if isinstance(cost, str):
        return {"spent": None, "savings": None, "spent_display": "no price", "savings_display": "no price",
                "waste_display": "no price", "cost_error": cost}
    data = job_cost_data(cost)
    return {"spent": data["spent"], "savings": data["savings"], "spent_display": display_money(data["spent"]),
            "savings_display": display_money(data["savings"]), "waste_display": display_money(data["waste"]["total"]),
            "cost_error": None}


def job_rows(jobs: list[Job], now: dt.datetime | None = None) -> list[dict]:
    now = now or timezone.now()
    ids = [job.pk for job in jobs]
    money = _money_of_jobs(ids, now)
    clouds = {}
    for job_id, provider in (Instance.objects.filter(job_id__in=ids).order_by("job_id", "-requested_at", "-id")
                             .values_list("job_id", "provider")):
        clouds.setdefault(job_id, provider)
    return [{
        "id": job.pk,
        "name": job.name,
        "url": reverse("job", args=[job.pk]),
        "owner": job.owner.username,
        "status": job.status,
        "status_reason": job.status_reason,
        "last_step": job.last_step,
        "total_steps": job.total_steps,
        "progress_pct": min(100, round(100 * job.last_step / job.total_steps)) if job.total_steps else None,
        "eta_s": (eta := _eta_seconds(job, money[job.pk])),
        "eta_display": display_duration(eta),
        "interruptions": job.preemptions,
        "cloud": clouds.get(job.pk, ""),
        **_money_fields(money[job.pk]),
    } for job in jobs]


# ---- one job ----------------------------------------------------------------------------------

def _instances(job: Job, cost) -> list[dict]:
    work = {} if isinstance(cost, str) else cost.work
    rows = []
    for instance in job.instances.order_by("requested_at", "id"):
        billed = work.get(instance.pk)
        rows.append({
            "id": instance.pk, "rank": instance.rank, "provider": instance.provider, "zone": instance.zone,
            "instance_type": instance.instance_type, "market": instance.market, "state": instance.state,
            "end_reason": instance.end_reason,
            "start": _iso(billed.billed_from if billed else instance.requested_at),
            "end": _iso(instance.ended_at),
            "label": f"#{instance.pk} rank {instance.rank} · {instance.zone or instance.region} "
                     f"{instance.instance_type} ({instance.market})",
        })
    return rows


def _markers(job: Job, instances: list[dict], checkpoints: list[Checkpoint]) -> list[dict]:
    markers = []
    for event in InterruptionEvent.objects.filter(instance__job=job).order_by("received_at", "id"):
        markers.append({"kind": event.kind, "instance": event.instance_id,
                        "at": _iso(event.notice_time or event.received_at),
                        "text": f"{event.kind} ({event.source})"})
    noted = {(m["instance"], m["kind"]) for m in markers}
    for row in instances:  # an agent's own "preempted" exit leaves no interruption row: the end says it
        if row["end_reason"] in ("preempted", "lost") and (row["id"], row["end_reason"]) not in noted:
            markers.append({"kind": row["end_reason"], "instance": row["id"], "at": row["end"],
                            "text": f"{row['end_reason']} (instance ended)"})
    for checkpoint in checkpoints:
        markers.append({"kind": "checkpoint", "instance": checkpoint.instance_id, "at": _iso(checkpoint.committed_at),
                        "text": f"checkpoint step {checkpoint.step} ({checkpoint.kind}, {checkpoint.validation})"})
    return sorted(markers, key=lambda m: m["at"] or "")


def _loss_curve(job: Job) -> list[list]:
    """(step, loss) pairs, every n-th point in time order so a long run stays a
    bounded answer with its shape kept."""
    points = MetricPoint.objects.filter(job=job, loss__isnull=False)
    stride = max(1, points.count() // LOSS_POINTS)
    numbered = points.annotate(row=Window(RowNumber(), order_by=[F("time").asc(), F("id").asc()]))
    if stride > 1:
        numbered = numbered.annotate(phase=F("row") % stride).filter(phase=0)
    return [[step, loss] for step, loss in numbered.order_by("time", "id").values_list("step", "loss")]


def _cost_curve(cost, now: dt.datetime) -> list[dict]:
    """Cumulative spend and on-demand baseline over time. Each instance's money
    accrues evenly over its billed interval: exact at every interval's end and at
    now, a straight line in between."""
    if isinstance(cost, str) or not cost.work:
        return []
    money = {int(row.instance_id): row for row in cost.ledger.instances}
    spans = [(w.billed_from, w.billed_to or now, money[w.instance_id]) for w in cost.work.values()]
    first, last = min(s for s, _, _ in spans), max(e for _, e, _ in spans)  # a finished job's curve ends with it
    moments = sorted({first, last, *(s for s, _, _ in spans), *(e for _, e, _ in spans)})
    if len(moments) < COST_POINTS:
        step = (last - first) / COST_POINTS
        moments = sorted(set(moments) | {first + step * i for i in range(COST_POINTS)})
    curve = []
    for moment in moments:
        spent = baseline = Decimal(0)
        for start, end, row in spans:
            if moment <= start:
                continue
            share = Decimal(1) if moment >= end else \
                Decimal((moment - start).total_seconds()) / Decimal((end - start).total_seconds())
            spent += row.spent * share
            baseline += row.baseline * share
        curve.append({"at": moment.isoformat(), "spent": float(spent), "on_demand": float(baseline)})
    return curve


def _log_tail(job: Job) -> list[str]:
    chunks = list(LogChunk.objects.filter(instance__job=job).order_by("-created_at", "-id")
                  .values_list("instance_id", "lines")[:LOG_CHUNKS])
    lines = []
    for instance_id, chunk in reversed(chunks):
        lines.extend(f"[{instance_id}] {line}" for line in chunk)
    return lines[-LOG_LINES:]


def job_status(job: Job, *, may_cancel: bool, now: dt.datetime | None = None) -> dict:
    now = now or timezone.now()
    cost = _money_of_jobs([job.pk], now)[job.pk]
    instances = _instances(job, cost)
    # The newest checkpoints, once: marked on the timeline and listed newest step first.
    checkpoints = list(reversed(Checkpoint.objects.filter(job=job).order_by("-committed_at", "-id")[:MARKED_CHECKPOINTS]))
    listed = sorted(checkpoints, key=lambda c: (c.step, c.committed_at), reverse=True)[:RECENT_ROWS]
    return {
        "job": {
            "id": job.pk, "name": job.name, "status": job.status, "status_reason": job.status_reason,
            "failure_cause": job.failure_cause, "last_step": job.last_step, "total_steps": job.total_steps,
            "eta_s": (eta := _eta_seconds(job, cost)), "eta_display": display_duration(eta),
            "preemptions": job.preemptions,
            "failure_restarts": job.failure_restarts, "artifact_uri": job.artifact_uri,
            "artifact_digest": job.artifact_digest,
            "cancellable": may_cancel and job.status in JobStatus.CANCELLABLE,
            "live": job.status not in JobStatus.TERMINAL,
        },
        "money": _money_fields(cost) | ({} if isinstance(cost, str) else {"detail": job_cost_data(cost)}),
        "instances": instances,
        "markers": _markers(job, instances, checkpoints),
        "loss": _loss_curve(job),
        "cost_curve": _cost_curve(cost, now),
        "checkpoints": [{
            "step": c.step, "kind": c.kind, "committed_at": _iso(c.committed_at), "validation": c.validation,
            "reference_loss": c.reference_loss, "validation_loss": c.validation_loss, "bytes": c.bytes,
            "stall_s": c.stall_s, "instance": c.instance_id,
        } for c in listed],
        "log": _log_tail(job),
        "events": [{"at": _iso(e.created_at), "from": e.from_status, "to": e.to_status, "message": e.message}
                   for e in reversed(JobEvent.objects.filter(job=job).order_by("-created_at", "-id")[:RECENT_ROWS])],
        "as_of": now.isoformat(),
    }


# ---- a team's month ---------------------------------------------------------------------------

def _team_month(team, month: str | None, now: dt.datetime) -> tuple[dict | None, str | None, list[dict]]:
    """(money, why it cannot be priced, interruptions by placement) of a team's month, cached briefly."""
    label = costs.parse_month(month, now)[0]
    newest_quote = PriceQuote.objects.aggregate(newest=Max("id"))["newest"]
    key = f"respawn:teammonth:{team.pk}:{label}:{newest_quote}"
    cached = cache.get(key)
    if cached is not None:
        return cached
    try:
        money, error = team_month_data(costs.team_month_cost(team, label, now)), None
    except costs.CostError as exc:
        money, error = None, str(exc)
    answer = (money, error, costs.interruptions_by_placement(team, label, now))
    cache.set(key, answer, TEAM_MONEY_TTL_S)
    return answer


def team_status(team, month: str | None, now: dt.datetime | None = None) -> dict:
    now = now or timezone.now()
    money, money_error, interruptions = _team_month(team, month, now)
    if money:
        money = dict(money)
        for key in ("spent", "savings", "waste", "on_demand_baseline"):
            money[f"{key}_display"] = display_money(money[key])
        money["budget_display"] = display_money(money["budget"]) if money["budget"] else "no budget"
        money["budget_used_pct"] = (min(999, round(100 * Decimal(money["spent"]) / Decimal(money["budget"])))
                                    if money["budget"] and Decimal(money["budget"]) > 0 else None)
    by_status = dict(Job.objects.filter(team=team, status__in=JobStatus.ACTIVE | {JobStatus.QUEUED})
                     .values_list("status").annotate(n=Count("id")).order_by())
    return {
        "month": costs.parse_month(month, now)[0],
        "money": money,
        "money_error": money_error,
        "interruptions": interruptions,
        "jobs_by_status": by_status,
        "live_instances": Instance.objects.filter(job__team=team, state__in=InstanceState.LIVE).count(),
        "as_of": now.isoformat(),
    }


# ---- prices -----------------------------------------------------------------------------------

def latest_prices(*, provider: str = "", instance_type: str = ""):
    """The quote in force now for each (cloud, region, zone, type, market)."""
    newer = PriceQuote.objects.filter(
        provider=OuterRef("provider"), region=OuterRef("region"), zone=OuterRef("zone"),
        instance_type=OuterRef("instance_type"), market=OuterRef("market"), observed_at__gt=OuterRef("observed_at"),
        observed_at__lte=timezone.now())
    quotes = PriceQuote.objects.filter(observed_at__lte=timezone.now()).exclude(Exists(newer))
    if provider:
        quotes = quotes.filter(provider=provider)
    if instance_type:
        quotes = quotes.filter(instance_type__icontains=instance_type)
    return quotes.order_by("provider", "instance_type", "region", "zone", "market")
