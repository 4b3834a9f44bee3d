"""Record a real run of the local provider for the money tests.

    .venv/bin/python tests/costs/record_local_run.py [OUT.json]

Starts the whole system on this machine in a private temporary var dir (SQLite,
filesystem broker, no server needed): gunicorn, a Celery worker and beat, and
local "VMs" each running the agent, which runs the tiny example trainer. The
local spot market reclaims every VM 20 s after it boots (10 s notice), so the
job is preempted four or five times before it finishes. Then it writes what the
control plane recorded about the job (its instances with their state changes,
heartbeats as metric points, checkpoints, interruptions, and the price quotes in
force) to OUT.json (default tests/costs/data/local_run.json), times as ISO 8601
UTC. `tests/costs/recorded.py` loads such a file into a test database.

Takes two to three minutes on a quiet machine; nothing is written to the
repository's own var/.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import tempfile
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = Path(__file__).resolve().parent / "data" / "local_run.json"
STEPS, STEP_DELAY_S = 2000, 0.03
MARKET = {"RESPAWN_LOCAL_MARKET": "every", "RESPAWN_LOCAL_PREEMPT_EVERY_S": "20", "RESPAWN_LOCAL_NOTICE_S": "10",
          "RESPAWN_HEARTBEAT_INTERVAL_S": "1", "RESPAWN_HEARTBEAT_TIMEOUT_S": "5",
          "RESPAWN_RECONCILE_INTERVAL_S": "1"}

INSTANCE_FIELDS = ("id", "rank", "provider", "region", "zone", "instance_type", "market", "state", "end_reason",
                   "requested_at", "registered_at", "running_at", "ended_at", "last_step", "resume_checkpoint_id",
                   "price_per_hour_at_launch", "agent_version", "preemption_confirmed")
EVENT_FIELDS = ("instance_id", "created_at", "from_state", "to_state", "message")
POINT_FIELDS = ("instance_id", "time", "step", "loss", "samples_per_s")
CHECKPOINT_FIELDS = ("id", "instance_id", "step", "kind", "committed_at", "save_s", "stall_s", "validation")
INTERRUPTION_FIELDS = ("instance_id", "kind", "source", "notice_time", "deadline", "received_at",
                       "checkpoint_saved", "steps_lost")
QUOTE_FIELDS = ("provider", "region", "zone", "instance_type", "market", "usd_per_hour", "observed_at")


def _plain(value):
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return value


def _rows(queryset, fields) -> list[dict]:
    return [{name: _plain(row[name]) for name in fields} for row in queryset.values(*fields)]


def dump(job) -> dict:
    from respawn_server.jobs.models import Checkpoint, InstanceEvent, InterruptionEvent, MetricPoint, PriceQuote

    instances = job.instances.order_by("requested_at", "id")
    return {
        "recorded_with": {"market": MARKET, "steps": STEPS, "step_delay_s": STEP_DELAY_S},
        "job": {"total_steps": job.total_steps, "status": job.status, "preemptions": job.preemptions,
                "created_at": _plain(job.created_at), "last_step": job.last_step},
        "instances": _rows(instances, INSTANCE_FIELDS),
        "instance_events": _rows(InstanceEvent.objects.filter(instance__job=job).order_by("created_at", "id"),
                                 EVENT_FIELDS),
        "metric_points": _rows(MetricPoint.objects.filter(job=job).order_by("time", "id"), POINT_FIELDS),
        "checkpoints": _rows(Checkpoint.objects.filter(job=job).order_by("committed_at", "id"), CHECKPOINT_FIELDS),
        "interruptions": _rows(InterruptionEvent.objects.filter(instance__job=job).order_by("received_at", "id"),
                               INTERRUPTION_FIELDS),
        "price_quotes": _rows(PriceQuote.objects.filter(provider="local").order_by("observed_at", "id"),
                              QUOTE_FIELDS),
    }


def record(out: Path) -> dict:
    var = Path(tempfile.mkdtemp(prefix="respawn-record-"))
    os.environ.update(RESPAWN_VAR_DIR=str(var), DATABASE_URL=f"sqlite:///{var / 'respawn.sqlite3'}",
                      CELERY_BROKER_URL="filesystem://", DJANGO_SETTINGS_MODULE="respawn_server.settings",
                      PYTHONUNBUFFERED="1", **MARKET)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    from respawn_server.jobs.core.choices import JobStatus
    from respawn_server.jobs.fleet.providers.local import LocalConfig, LocalProvider
    from respawn_server.jobs.models import Job
    from tests.conftest import WebServer, start_worker_and_beat, wait_until
    from tests.factories import make_job, make_team_with_members

    call_command("migrate", interactive=False, verbosity=0)
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, name="recorded-local-run",
                   command=[sys.executable, "-m", "respawn.examples.tiny", "--steps", str(STEPS),
                            "--step-delay", str(STEP_DELAY_S)],
                   total_steps=STEPS, checkpoint_uri=str(var / "ckpt"), checkpoint_interval_s=2.0,
                   allowed_clouds=["local"], instance_types=["cpu-small"],
                   validation_model_factory="respawn.examples.tiny:make_model",
                   validation_batch_factory="respawn.examples.tiny:validation_batch")
    env = dict(os.environ)
    web = WebServer(env, var / "web.log").start()
    env["RESPAWN_API_URL"] = web.url
    worker, beat = start_worker_and_beat(env, var)
    try:
        wait_until(lambda: Job.objects.get(pk=job.pk).status in JobStatus.TERMINAL, timeout=900,
                   what="the recorded job to finish", proc=worker, interval=1.0)
    finally:
        beat.stop()
        worker.stop()
        web.stop()
        LocalProvider(LocalConfig(root=str(var / "local-vms"))).terminate_all()
    job.refresh_from_db()
    recorded = dump(job)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(recorded, indent=1) + "\n")
    return recorded


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else DEFAULT_OUT
    recorded = record(out)
    ends = [i["end_reason"] for i in recorded["instances"]]
    print(f"{out}: job {recorded['job']['status']}, {len(ends)} instances ({', '.join(ends)}), "
          f"{len(recorded['metric_points'])} heartbeats, {len(recorded['checkpoints'])} checkpoints")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
