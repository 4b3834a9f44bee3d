"""What the dashboard pages and their JSON status views show, read in a fixed
number of queries per page whatever the number of jobs, instances or points.

Money comes from `respawn_server.frontend.money` (the ledger's figures in the API's format, kept
once settled), so a figure on a page is the API's figure."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from django.db.models import Exists, OuterRef
from django.urls import reverse
from django.utils import timezone

from respawn_server.frontend import money as store
from respawn_server.frontend import reads, story
from respawn_server.frontend.money import display_money
from respawn_server.jobs.core.choices import FailureCause, JobStatus, Market
from respawn_server.jobs.models import PriceQuote, Team, failure_headline
from respawn_server.jobs.money import costs
from respawn.vocabulary.money import money_figures

JOBS_PER_PAGE = 25
COUNTED_PAST = 1000  # a list counts this many jobs past the page shown, not a team's whole history
LOSS_POINTS = 2000
LOG_CHUNKS = 100  # most chunks read for one answer of the log; agents send bounded batches
LOG_CHARS = 1 << 20  # an answer of the log stops after the chunk that passes this many characters
RECENT_ROWS = 50
MARKED_CHECKPOINTS = 500
URL_ID = 987654321  # stands in for a job's id in a reversed URL


def display_duration(seconds: int | None) -> str:
    if seconds is None:
        return "–"
    hours, minutes, secs = seconds // 3600, seconds % 3600 // 60, seconds % 60
    return f"{hours} h {minutes} min" if hours else f"{minutes} min {secs} s" if minutes else f"{secs} s"


def _iso(moment: dt.datetime | None) -> str | None:
    return moment.isoformat() if moment else None


# ---- jobs list --------------------------------------------------------------------------------

def filtered_jobs(team_id: int, *, statuses=(), owner="", cloud="", search="", page: int = 1) -> reads.JobList:
    """The team's jobs for list page `page`, counted at most COUNTED_PAST jobs past it."""
    return reads.JobList(team_id, statuses=statuses, owner=owner, cloud=cloud, search=search,
                         count_to=page * JOBS_PER_PAGE + COUNTED_PAST)


def _eta_seconds(job: dict, money) -> int | None:
    if job["status"] != JobStatus.RUNNING or not job["total_steps"] or isinstance(money, str):
        return None
    if money["seconds_per_step"] is None or not Decimal(money["seconds_per_step"]):
        return None
    return int(max(0, job["total_steps"] - job["last_step"]) * Decimal(money["seconds_per_step"]))


def _money_fields(money) -> dict:
    if isinstance(money, str):
        return {"spent": None, "savings": None, "spent_display": "no price", "savings_display": "no price",
                "waste_display": "no price", "waste_parts_display": "", "drills": None, "drills_display": "",
                "drills_parts_display": "", "cost_error": money}
    return {"spent": money["spent"], "savings": money["savings"], "spent_display": money["spent_display"],
            "savings_display": money["savings_display"], "waste_display": money["waste_display"],
            "waste_parts_display": money["waste_parts_display"], "drills": money["drills"],
            "drills_display": money["drills_display"], "drills_parts_display": money["drills_parts_display"],
            "cost_error": None}


def job_rows(jobs: list[dict], now: dt.datetime | None = None) -> list[dict]:
    """`jobs`: a page of `filtered_jobs`."""
    money = store.job_money({job["id"]: job["money_key"] for job in jobs}, now or timezone.now())
    job_url = reverse("job", args=[URL_ID]).replace(str(URL_ID), "{}")  # one reverse, not one per row
    return [{
        "id": job["id"],
        "name": job["name"],
        "url": job_url.format(job["id"]),
        "owner": job["owner"],
        "status": job["status"],
        "status_reason": job["status_reason"],
        "last_step": job["last_step"],
        "total_steps": job["total_steps"],
        "progress_pct": min(100, round(100 * job["last_step"] / job["total_steps"])) if job["total_steps"] else None,
        "eta_s": (eta := _eta_seconds(job, money[job["id"]])),
        "eta_display": display_duration(eta),
        "interruptions": job["preemptions"],
        "cloud": job["cloud"] or "",
        **_money_fields(money[job["id"]]),
    } for job in jobs]


# ---- one job ----------------------------------------------------------------------------------

def _instances(found: list[dict], money) -> list[dict]:
    billed = {} if isinstance(money, str) else {i["instance"]: i["billed_from"] for i in money["detail"]["instances"]}
    return [{
        "id": instance["id"], "rank": instance["rank"], "provider": instance["provider"],
        "zone": instance["zone"], "instance_type": instance["instance_type"], "market": instance["market"],
        "state": instance["state"], "end_reason": instance["end_reason"],
        "start": billed.get(instance["id"]) or _iso(instance["requested_at"]),
        "end": _iso(instance["ended_at"]),
        "label": f"#{instance['id']} rank {instance['rank']} · {instance['zone'] or instance['region']} "
                 f"{instance['instance_type']} ({instance['market']})",
    } for instance in found]


def _where_the_gang_resumed(size: dict) -> str:
    """A world size's "resumed at" words: a regroup always resumed from somewhere (the start,
    when the gang had no checkpoint yet); a placement or a growth only from a checkpoint."""
    if size["resume_step"] is None:
        return story.where_resumed(0, "") if size["regroup"] else ""
    return story.where_resumed(size["resume_step"], "memory" if size["from_memory"] else "storage")


def _markers(interruptions: list[dict], instances: list[dict], checkpoints: list[dict]) -> list[dict]:
    markers = []
    for event in interruptions:
        markers.append({"kind": event["kind"], "instance": event["instance_id"],
                        "at": _iso(event["notice_time"] or event["received_at"]),
                        "text": f"{event['kind']} ({event['source']})"})
    noted = {(m["instance"], m["kind"]) for m in markers}
    for row in instances:  # an agent's own "preempted" exit leaves no interruption row: the end says it
        if row["end_reason"] in ("preempted", "lost") and (row["id"], row["end_reason"]) not in noted:
            markers.append({"kind": row["end_reason"], "instance": row["id"], "at": row["end"],
                            "text": f"{row['end_reason']} (instance ended)"})
    for checkpoint in checkpoints:
        markers.append({"kind": "checkpoint", "instance": checkpoint["instance"], "at": checkpoint["committed_at"],
                        "text": f"checkpoint step {checkpoint['step']} ({checkpoint['kind']}, "
                                f"{checkpoint['validation']})"})
    return sorted(markers, key=lambda m: m["at"] or "")


def job_log(job_id: int, after: int) -> dict:
    """The job's log lines past chunk `after`, from its first line on, a bounded answer
    at a time: `next` is the cursor to ask with next, `more` whether more is there now."""
    chunks = reads.log_chunks_after(job_id, after, LOG_CHUNKS).run()
    lines, chars, cursor, taken = [], 0, after, 0
    for taken, (cursor, instance_id, chunk) in enumerate(chunks, start=1):
        lines.extend(f"[{instance_id}] {line}" for line in chunk)
        chars += sum(len(line) for line in chunk)
        if chars > LOG_CHARS:
            break
    return {"lines": lines, "next": cursor, "more": len(chunks) == LOG_CHUNKS or taken < len(chunks)}


def _checkpoints(newest_first: list[dict]) -> list[dict]:
    """Oldest first, as the timeline marks them."""
    return [{"step": c["step"], "kind": c["kind"], "committed_at": _iso(c["committed_at"]), "tiers": c["tiers"],
             "validation": c["validation"], "validation_message": c["validation_message"],
             "reference_loss": c["reference_loss"],
             "validation_loss": c["validation_loss"], "bytes": c["bytes"], "stall_s": c["stall_s"],
             "instance": c["instance_id"]} for c in reversed(newest_first)]


def job_money(job: dict, now: dt.datetime, *, detail: bool = False) -> dict | str:
    """The money summary of `job` (from `reads.job`), with the API's detail if asked,
    or why it cannot be priced."""
    return store.job_money({job["id"]: job["money_key"]}, now, detail=detail)[job["id"]]


def _failure(job: dict) -> str:
    """Why a failed job failed, in one line: its cause, then the failure's headline
    (for the user's code, its exit code and last exception line)."""
    if job["status"] != JobStatus.FAILED:
        return ""
    cause = FailureCause.LABELS.get(job["failure_cause"], "Failed")
    detail = failure_headline(job["failure_message"]) or job["status_reason"]
    return f"{cause}: {detail}" if detail else cause


def job_summary(job: dict, money, *, may_cancel: bool, now: dt.datetime) -> dict:
    """What the job page shows as it loads, before its script fetches `job_status`."""
    return {
        "job": {
            "id": job["id"], "name": job["name"], "status": job["status"], "status_reason": job["status_reason"],
            "failure_cause": job["failure_cause"], "failure": _failure(job),
            "last_step": job["last_step"], "total_steps": job["total_steps"],
            "eta_s": (eta := _eta_seconds(job, money)), "eta_display": display_duration(eta),
            "preemptions": job["preemptions"], "failure_restarts": job["failure_restarts"],
            "artifact_uri": job["artifact_uri"], "artifact_digest": job["artifact_digest"],
            "cancellable": may_cancel and job["status"] in JobStatus.CANCELLABLE,
            "live": job["status"] not in JobStatus.TERMINAL,
        },
        "money": _money_fields(money) | (
            {"detail": money["detail"] | {"as_of": now.isoformat()}} if isinstance(money, dict) and "detail" in money
            else {}),
    }


def job_status(job: dict, *, may_cancel: bool, now: dt.datetime | None = None) -> dict:
    """Everything the job page draws; `job` from `reads.job`."""
    now = now or timezone.now()
    job_id = job["id"]
    money = job_money(job, now, detail=True)
    summary = job_summary(job, money, may_cancel=may_cancel, now=now)
    found, newest_checkpoints, interruptions, loss, curve, events, sizes = reads.batch(
        reads.instances(job_id), reads.newest_checkpoints(job_id, MARKED_CHECKPOINTS), reads.interruptions(job_id),
        reads.loss_points(job_id, LOSS_POINTS), reads.curve_instances(job_id),
        reads.newest_events(job_id, RECENT_ROWS), reads.world_sizes(job_id))
    instances, checkpoints = _instances(found, money), _checkpoints(newest_checkpoints)
    interval = next((i["checkpoint_interval"] for i in reversed(found) if i["checkpoint_interval"] is not None), None)
    listed = sorted(checkpoints, key=lambda c: (c["step"], c["committed_at"]), reverse=True)[:RECENT_ROWS]
    return {
        "job": summary["job"] | {"checkpoint_interval": interval},
        "money": summary["money"],
        "instances": instances,
        "markers": _markers(interruptions, instances, checkpoints),
        "loss": loss,
        "loss_marks": story.loss_marks(curve),
        "cost_curve": [] if isinstance(money, str) else money["curve"],
        "checkpoints": listed,
        "events": [{"at": _iso(e["created_at"]), "from": e["from_status"], "to": e["to_status"],
                    "message": e["message"]} for e in reversed(events)],
        "world_sizes": [{"at": _iso(w["at"]), "world_size": w["world_size"], "reason": w["reason"],
                         "resumed": _where_the_gang_resumed(w)} for w in sizes],
        "as_of": now.isoformat(),
    }


# ---- a team's month ---------------------------------------------------------------------------

def team_status(team_id: int, month: str | None, *also: reads.Read,
                now: dt.datetime | None = None) -> tuple[Team, dict, list]:
    """The team, its overview's figures and the answers of `also`, read in the same
    round trip (the caller has checked the team may be seen)."""
    now = now or timezone.now()
    label = costs.parse_month(month, now)[0]
    team, live, newest, by_status, *found = reads.batch(
        reads.team(team_id), reads.live_instances(team_id), reads.newest_ids(),
        reads.jobs_by_status(team_id, JobStatus.ACTIVE | {JobStatus.QUEUED}), *also)
    month_money = store.team_month(team, label, now, live=live, newest=newest)
    money = month_money.money
    if money:
        money = dict(money)
        for key, text in money_figures(money["spent"], money["savings"], money["on_demand_baseline"]).items():
            money[f"{key}_display"] = text
        money["waste_display"] = display_money(money["waste"])
        money["budget_display"] = display_money(money["budget"]) if money["budget"] else "no budget"
        money["budget_used_pct"] = (min(999, round(100 * Decimal(money["spent"]) / Decimal(money["budget"])))
                                    if money["budget"] and Decimal(money["budget"]) > 0 else None)
    return team, {
        "month": label,
        "money": money,
        "money_error": month_money.error,
        "interruptions": month_money.interruptions,
        "jobs_by_status": by_status,
        "live_instances": month_money.live_instances,
        "as_of": now.isoformat(),
    }, found


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


def price_rows(quotes, launchable: list[str]) -> list[dict]:
    """`quotes` (from `latest_prices`) as one row per (cloud, region, zone, type): the spot
    price beside the on-demand one (the zone's own, else the region's, as the price book
    reads them) and the discount. What this deployment can launch (`launchable`, in
    that order) comes first. A region-wide on-demand price shown beside its zones' spot
    prices has no row of its own."""
    by_key = {(q.provider, q.region, q.zone, q.instance_type, q.market): q for q in quotes}
    zoned = {(p, r, t) for (p, r, z, t, _m) in by_key if z}
    rows = {}
    for provider, region, zone, instance_type, market in by_key:
        if not zone and market == Market.ON_DEMAND and (provider, region, instance_type) in zoned:
            continue
        spot = by_key.get((provider, region, zone, instance_type, Market.SPOT))
        on_demand = (by_key.get((provider, region, zone, instance_type, Market.ON_DEMAND))
                     or by_key.get((provider, region, "", instance_type, Market.ON_DEMAND)))
        discount = (round(100 * (1 - spot.usd_per_hour / on_demand.usd_per_hour))
                    if spot and on_demand and on_demand.usd_per_hour > 0 else None)
        shown = spot or on_demand
        rows[(provider, region, zone, instance_type)] = {
            "provider": provider, "region": region, "zone": zone, "instance_type": instance_type,
            "spot": spot and spot.usd_per_hour, "on_demand": on_demand and on_demand.usd_per_hour,
            "discount_pct": discount, "observed_at": shown.observed_at, "source": shown.source,
            "launchable": provider in launchable}
    rank = {provider: n for n, provider in enumerate(launchable)}
    return sorted(rows.values(), key=lambda row: (rank.get(row["provider"], len(rank)), row["provider"],
                                                  row["instance_type"], row["region"], row["zone"]))
