"""Dashboard server time and query counts on a big PostgreSQL history (issue 6).

Builds a fresh database (default `respawn_bench_dashboard` on 127.0.0.1:5432) with
N jobs, 5 instances per job (relaunches across zones and markets after a notice,
each resuming from its predecessor's notice checkpoint) and M metric points, then times, in-process
through the whole middleware stack, the jobs page, a job page (and its status
JSON), the team overview (and its JSON) against a trivial signed-in view in the
same run. Query counts are compared between a small and a big case of each page:
they must not grow with the rows.

    .venv/bin/python bench/dashboard.py                 # scaled down: 1,000 jobs, 100,000 points
    .venv/bin/python bench/dashboard.py --full --check  # 10,000 jobs, 50,000 instances, 1,000,000 points

--check exits 1 when a page's p95 exceeds 3x the trivial view's p95 or a query
count grows with the rows.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

INSTANCES_PER_JOB = 5
RATIO_LIMIT = 3.0
ZONES = ("local-a", "local-b", "local-c")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000)
    parser.add_argument("--points", type=int, default=100_000, help="metric points in all")
    parser.add_argument("--full", action="store_true", help="the issue's size: 10,000 jobs, 1,000,000 points")
    parser.add_argument("--requests", type=int, default=100, help="timed requests per page (taken in turns)")
    parser.add_argument("--database-url", default=os.environ.get(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/respawn_bench_dashboard"))
    parser.add_argument("--reuse", action="store_true", help="keep an already filled database")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--smoke", action="store_true",
                        help="10 jobs, 100 points, 2 requests a page: the suite's run that keeps the bench working")
    args = parser.parse_args(argv)
    if args.smoke:
        args.jobs, args.points, args.requests = 10, 100, 2
    if args.full:
        args.jobs, args.points = 10_000, 1_000_000
    if args.jobs < 10 or args.points < args.jobs * INSTANCES_PER_JOB * 2:
        parser.error("need at least 10 jobs and 2 metric points per instance")
    return args


def recreate_database(url: str) -> None:
    from urllib.parse import urlparse

    import psycopg

    name = urlparse(url).path.lstrip("/")
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def setup_django(url: str):
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "respawn_server.settings")
    os.environ.setdefault("RESPAWN_LOG_LEVEL", "WARNING")
    import django

    django.setup()


# ---- the history ------------------------------------------------------------------------------

def fill(jobs: int, points: int, now: dt.datetime) -> None:
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection

    from respawn_server.jobs.core.choices import Purpose
    from respawn_server.jobs.models import (Checkpoint, Instance, InterruptionEvent, Job, Membership, MetricPoint,
                                            PriceQuote, Team)

    call_command("migrate", verbosity=0)  # seeds the price book
    # The history reaches back before the shipped book's date: the same prices, in force from a year ago.
    PriceQuote.objects.bulk_create([
        PriceQuote(provider=q.provider, region=q.region, zone=q.zone, instance_type=q.instance_type, market=q.market,
                   usd_per_hour=q.usd_per_hour, observed_at=now - dt.timedelta(days=365), source="bench")
        for q in PriceQuote.objects.filter(provider="local")])
    rng = random.Random(6)
    big, small = Team.objects.create(name="big", monthly_budget_usd=50_000), Team.objects.create(name="small")
    user = User.objects.create_user("bench", password="bench-password")
    for team in (big, small):
        Membership.objects.create(user=user, team=team, role="admin")
    statuses = ["succeeded"] * 6 + ["running", "failed", "cancelled", "queued"]
    Job.objects.bulk_create([Job(team=big if i else small, owner=user, name=f"train-{i:05d}",
                                 command=["python", "train.py"], total_steps=10_000, status=rng.choice(statuses),
                                 last_step=rng.randrange(10_000), preemptions=rng.randrange(5))
                             for i in range(jobs)], batch_size=2_000)
    job_ids = list(Job.objects.order_by("id").values_list("id", flat=True))
    per_instance = points // (jobs * INSTANCES_PER_JOB)
    raw = connection.connection
    with raw.cursor() as cur:
        instances = []
        for n, job_id in enumerate(job_ids):
            start = now - dt.timedelta(days=60) * (n / jobs) - dt.timedelta(hours=6)
            for k in range(INSTANCES_PER_JOB):
                begin = start + dt.timedelta(hours=k)
                last = k == INSTANCES_PER_JOB - 1
                instances.append(dict(
                    job_id=job_id, purpose=Purpose.TRAIN, provider="local", region="local", zone=ZONES[k % 3],
                    instance_type="cpu-small", market="on_demand" if k == 3 else "spot", state="ended",
                    end_reason="completed" if last else "preempted", requested_at=begin - dt.timedelta(seconds=30),
                    registered_at=begin + dt.timedelta(seconds=90), running_at=begin + dt.timedelta(seconds=90),
                    ended_at=begin + dt.timedelta(minutes=50), last_step=(k + 1) * 2_000))
        copy_rows(cur, Instance, instances)
        cur.execute("SELECT id, job_id, registered_at, ended_at, last_step FROM jobs_instance ORDER BY id")
        instances = cur.fetchall()
        # Each preempted VM had its notice (3 minutes before its end) and saved on it: the
        # job page splits each such interruption's downtime (jobs/money/downtime.py). The
        # small team's lone job has none, so its page is the small case of that read too.
        preempted = {instance_id for instance_id, job_id, *_, last_step in instances
                     if last_step < INSTANCES_PER_JOB * 2_000 and job_id != job_ids[0]}
        copy_rows(cur, InterruptionEvent, (
            dict(instance_id=instance_id, kind="notice", source="local", notice_time=ended - dt.timedelta(minutes=3),
                 deadline=ended - dt.timedelta(minutes=1), received_at=ended - dt.timedelta(minutes=3))
            for instance_id, _, _, ended, _ in instances if instance_id in preempted))
        copy_rows(cur, Checkpoint, (
            dict(checkpoint_id=uuid.uuid4(), job_id=job_id, instance_id=instance_id, step=last_step - 100,
                 uri="file:///ckpt", bytes=1_048_576, manifest_digest="xxh3:0",
                 kind="notice" if instance_id in preempted else "periodic",
                 committed_at=ended - dt.timedelta(minutes=2), stall_s=0.4, validation="valid", created_at=ended,
                 validated_at=ended + dt.timedelta(minutes=1))
            for instance_id, job_id, _, ended, last_step in instances))
        cur.execute("UPDATE jobs_instance i SET resume_checkpoint_id = c.id FROM jobs_checkpoint c "
                    "WHERE c.instance_id = i.id - 1 AND c.job_id = i.job_id")
        copy_rows(cur, MetricPoint, (
            dict(job_id=job_id, instance_id=instance_id, time=registered + dt.timedelta(seconds=60 + 40 * p),
                 step=last_step - 2_000 + p * 2_000 // per_instance, loss=3.0 / (1 + p), samples_per_s=120.0)
            for instance_id, job_id, registered, _, last_step in instances for p in range(per_instance)))
    raw.commit()
    with connection.cursor() as cur:
        # What autovacuum does within a minute of a bulk load: statistics, and the visibility
        # map that lets counts read an index alone. Timing right after the COPY would measure
        # a state a real database leaves at once.
        cur.execute("VACUUM ANALYZE")


def copy_rows(cur, model, rows) -> None:
    """COPY `rows` (dicts keyed by field attname) into `model`'s table, every column the model has.

    The columns come from the model, not from a list kept here: a field added later takes its
    default (or NULL where it allows one), so a migration cannot leave the fixture short of a
    NOT NULL column again (register_failures, 0010, did). A new field with neither names itself.
    """
    from django.db import connection

    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    # What Django itself would store for a field left out: its default (called per row: a
    # client_token is unique), NULL, or '' for text.
    fillable = {f.attname for f in fields if f.has_default() or f.null or f.empty_strings_allowed}
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    with cur.copy(f"COPY {connection.ops.quote_name(model._meta.db_table)} ({columns}) FROM STDIN") as copy:
        for row in rows:
            values = []
            for f in fields:
                if f.attname in row:
                    value = row[f.attname]
                elif f.attname in fillable:
                    value = f.get_default()
                else:
                    raise SystemExit(f"bench/dashboard.py: {model.__name__}.{f.name} has no default: give it a value")
                values.append(f.get_db_prep_save(value, connection))
            copy.write_row(values)


# ---- timing -----------------------------------------------------------------------------------

def trivial(request):
    from django.contrib.auth.decorators import login_required
    from django.http import HttpResponse

    return login_required(lambda r: HttpResponse("ok"))(request)


def install_trivial_view() -> None:
    """The baseline: a signed-in view that does nothing, behind the same middleware."""
    import types

    from django.conf import settings
    from django.urls import clear_url_caches, include, path

    urls = types.ModuleType("bench_dashboard_urls")
    urls.urlpatterns = [path("bench/trivial", trivial), path("", include("respawn_server.urls"))]
    sys.modules[urls.__name__] = urls
    settings.ROOT_URLCONF = urls.__name__
    clear_url_caches()


def warm(client, url: str) -> int:
    """Fills the caches (steady state is what a poller sees); the queries of the next answer."""
    from django.db import connection

    first = client.get(url)
    assert first.status_code == 200, (url, first.status_code, first.content[:300])
    queries = []
    with connection.execute_wrapper(lambda execute, sql, *rest: queries.append(sql) or execute(sql, *rest)):
        client.get(url)
    return len(queries)


def timed(client, urls: dict[str, str], rounds: int) -> dict[str, list[float]]:
    """Server time of each page, asked in turn round after round: on a shared machine
    a burst of someone else's load then falls on every page alike, instead of on
    whichever page was being timed while it lasted."""
    samples = {name: [] for name in urls}
    for _ in range(rounds):
        for name, url in urls.items():
            begin = time.perf_counter()
            response = client.get(url)
            samples[name].append(time.perf_counter() - begin)
            assert response.status_code == 200
    return samples


def p95(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=20)[-1] if len(samples) >= 20 else max(samples)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.reuse:
        recreate_database(args.database_url)
    setup_django(args.database_url)
    from django.test import Client
    from django.utils import timezone

    from respawn_server.jobs.models import Instance, Job, MetricPoint, Team

    now = timezone.now()
    if not args.reuse:
        begin = time.perf_counter()
        fill(args.jobs, args.points, now)
        print(f"filled in {time.perf_counter() - begin:.0f} s")
    print(f"rows: {Job.objects.count():,} jobs, {Instance.objects.count():,} instances, "
          f"{MetricPoint.objects.count():,} metric points")
    install_trivial_view()
    client = Client()
    client.login(username="bench", password="bench-password")
    big, small = Team.objects.get(name="big"), Team.objects.get(name="small")
    busiest = Job.objects.filter(team=big).order_by("-id").first()  # newest: its month is this month
    lone = Job.objects.filter(team=small).first()
    client.post("/team/switch/", {"team": big.pk})

    pages = {
        "trivial view": ("/bench/trivial", None),
        "jobs page": ("/", "/?q=train-0000"),  # a full page vs a search matching a few rows
        "jobs JSON": ("/jobs.json", "/jobs.json?q=train-0000"),
        "job page": (f"/jobs/{busiest.pk}/", f"/jobs/{lone.pk}/"),  # interrupted 4 times vs never
        "job JSON": (f"/jobs/{busiest.pk}/status.json", f"/jobs/{lone.pk}/status.json"),
        "team overview": (f"/teams/{big.pk}/", f"/teams/{small.pk}/"),
        "team JSON": (f"/teams/{big.pk}/status.json", f"/teams/{small.pk}/status.json"),
    }
    queries = {name: (warm(client, url), warm(client, small_url) if small_url else None)
               for name, (url, small_url) in pages.items()}
    client.post("/team/switch/", {"team": big.pk})  # the small team's overview made it the current one
    samples = timed(client, {name: url for name, (url, _) in pages.items()}, args.requests)
    results = {name: (p95(samples[name]), statistics.median(samples[name]), n_big, n_big if n_small is None else n_small)
               for name, (n_big, n_small) in queries.items()}
    base = results["trivial view"][0]
    failures = []
    print(f"{'page':<15} {'p95 ms':>8} {'median ms':>10} {'x trivial':>10} {'queries big/small':>18}")
    for name, (slow, median, queries, small_queries) in results.items():
        ratio = slow / base
        print(f"{name:<15} {slow * 1e3:8.1f} {median * 1e3:10.1f} {ratio:10.2f} {queries:>9}/{small_queries}")
        if name != "trivial view" and ratio > RATIO_LIMIT:
            failures.append(f"{name}: p95 {ratio:.1f}x the trivial view's (limit {RATIO_LIMIT}x)")
        if queries > small_queries:
            failures.append(f"{name}: {queries} queries for the big case, {small_queries} for the small one")
    for failure in failures:
        print("FAIL", failure)
    return 1 if args.check and failures else 0


if __name__ == "__main__":
    sys.exit(main())
