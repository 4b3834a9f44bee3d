"""A run recorded by `tests/costs/record_local_run.py`, loaded into the test database.

`until` replays the run as the control plane saw it at that moment: rows recorded
later are left out, and an instance that ended later is still running."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path

from respawn_server.jobs.core.choices import InstanceState, JobStatus
from respawn_server.jobs.models import Checkpoint, Instance, InstanceEvent, InterruptionEvent, MetricPoint, PriceQuote
from tests.factories import make_instance, make_job

LOCAL_RUN = Path(__file__).resolve().parent / "data" / "local_run.json"


def read(path: Path = LOCAL_RUN) -> dict:
    return json.loads(path.read_text())


def at(text: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(text) if text else None


MOMENTS = {"job": ("created_at",), "instances": ("requested_at", "registered_at", "running_at", "ended_at"),
           "instance_events": ("created_at",), "metric_points": ("time",), "checkpoints": ("committed_at",),
           "interruptions": ("notice_time", "deadline", "received_at"), "price_quotes": ("observed_at",)}


def moved(run: dict, by: dt.timedelta) -> dict:
    """The run with every moment `by` later (what weighs recent history, placement's
    estimates, reads it as recent)."""
    def move(row: dict, names) -> dict:
        return row | {name: (at(row[name]) + by).isoformat() for name in names if row.get(name)}

    return run | {key: move(run[key], names) if isinstance(run[key], dict) else [move(row, names) for row in run[key]]
                  for key, names in MOMENTS.items()}


def _before(rows, field, until):
    return [r for r in rows if until is None or at(r[field]) <= until]


def _confirmed(row: dict, run: dict) -> bool | None:
    """Whether the cloud confirmed the instance's preemption. Recordings made before the
    recorder kept the field: the local market's reclaims after its notice, which the
    control plane confirms (the VM is gone)."""
    if "preemption_confirmed" in row:
        return row["preemption_confirmed"]
    if row["end_reason"] != "preempted":
        return None
    return any(i["instance_id"] == row["id"] and i["kind"] == "notice" for i in run["interruptions"])


def load(team, owner, run: dict, until: dt.datetime | None = None):
    """The recorded job, with its rows up to `until`; (job, {recorded instance id: Instance})."""
    for q in run["price_quotes"]:
        PriceQuote.objects.get_or_create(**{k: q[k] for k in ("provider", "region", "zone", "instance_type", "market")},
                                         observed_at=at(q["observed_at"]), defaults={"usd_per_hour": q["usd_per_hour"]})
    finished = until is None or at(run["instances"][-1]["ended_at"]) <= until
    job = make_job(team, owner, total_steps=run["job"]["total_steps"],
                   status=run["job"]["status"] if finished else JobStatus.RUNNING)
    instances, checkpoints = {}, {}
    points = _before(run["metric_points"], "time", until)
    for row in _before(run["instances"], "requested_at", until):
        ended = at(row["ended_at"]) if until is None or at(row["ended_at"]) <= until else None
        mine = [p["step"] for p in points if p["instance_id"] == row["id"]]
        instance = make_instance(job, rank=row["rank"], **{k: row[k] for k in (
            "provider", "region", "zone", "instance_type", "market")}).instance
        Instance.objects.filter(pk=instance.pk).update(
            state=row["state"] if ended else InstanceState.RUNNING, end_reason=row["end_reason"] if ended else "",
            requested_at=at(row["requested_at"]), registered_at=at(row["registered_at"]),
            running_at=at(row["running_at"]), ended_at=ended,
            preemption_confirmed=_confirmed(row, run) if ended else None,
            last_step=row["last_step"] if ended else max(mine, default=0),
            resume_checkpoint=checkpoints.get(row["resume_checkpoint_id"]))
        instances[row["id"]] = instance
        for c in _before(run["checkpoints"], "committed_at", until):
            if c["instance_id"] == row["id"]:
                checkpoints[c["id"]] = Checkpoint.objects.create(
                    checkpoint_id=uuid.uuid4(), job=job, instance=instance, step=c["step"], uri=f"ckpt/{c['step']}",
                    bytes=1, manifest_digest="d", kind=c["kind"], committed_at=at(c["committed_at"]),
                    save_s=c["save_s"], stall_s=c["stall_s"], validation=c["validation"])
    for e in _before(run["instance_events"], "created_at", until):
        if e["instance_id"] in instances:
            event = InstanceEvent.objects.create(instance=instances[e["instance_id"]], from_state=e["from_state"],
                                                 to_state=e["to_state"], message=e["message"])
            InstanceEvent.objects.filter(pk=event.pk).update(created_at=at(e["created_at"]))
    MetricPoint.objects.bulk_create([
        MetricPoint(job=job, instance=instances[p["instance_id"]], time=at(p["time"]), step=p["step"], loss=p["loss"],
                    samples_per_s=p["samples_per_s"]) for p in points])
    for i in _before(run["interruptions"], "received_at", until):
        event = InterruptionEvent.objects.create(
            instance=instances[i["instance_id"]], kind=i["kind"], source=i["source"], notice_time=at(i["notice_time"]),
            deadline=at(i["deadline"]), checkpoint_saved=i["checkpoint_saved"], steps_lost=i["steps_lost"])
        InterruptionEvent.objects.filter(pk=event.pk).update(received_at=at(i["received_at"]))
    newest = max(instances.values(), key=lambda i: i.pk)
    newest.refresh_from_db()
    job.last_step = newest.last_step
    # The whole run: the counter as the control plane kept it; part of it: the preemptions so far.
    job.preemptions = run["job"]["preemptions"] if finished else sum(
        1 for i in instances.values() if Instance.objects.get(pk=i.pk).end_reason == "preempted")
    job.save(update_fields=["last_step", "preemptions"])
    return job, instances
