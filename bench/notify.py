"""Notifications against the heartbeat path (issue 21): heartbeats/s with 1,000
subscriptions, one of them a dead endpoint, over heartbeats/s with none, measured in
the same run on the same stack; and the time from a job's failure to its webhook.

Builds a fresh database (default `respawn_bench_notify` on 127.0.0.1:5432) with one
running job and agent per simulated VM, starts gunicorn and a Celery worker on it
(broker: Redis, a key prefix of its own) and a webhook receiver on 127.0.0.1. Phases
alternate, without subscriptions and with them (A B B A A B ...), each driving heartbeats
round-robin over the agents while, in the background, one job a period fails
through the agent API (its exit report), as the same VMs' jobs would:

  - without: the team has no subscriptions, so a failure writes no notification;
  - with: the team has 1,000 subscriptions. `--matching` of them ask for job
    failures (one of those a dead endpoint: a socket that accepts connections and
    never answers, so every attempt waits out the timeout and is retried; one the
    live receiver whose arrivals are timed); the rest ask for other events.

    .venv/bin/python bench/notify.py            # ~3 minutes
    .venv/bin/python bench/notify.py --check    # exit 1 on a miss

--check exits 1 when heartbeats/s with subscriptions / without < 0.95, a request
failed, or a failure's webhook never arrived.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.dashboard import recreate_database, setup_django  # noqa: E402  (after the path insert)
from bench.heartbeats import Phase, add_load_args, make_agents, ms, run_phase, start_web, stop_web  # noqa: E402
from tests.notify.receiver import Receiver  # noqa: E402

RATIO_MIN = 0.95
SUBSCRIPTIONS = 1_000


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=1_000, help="VMs sending heartbeats")
    parser.add_argument("--failing", type=int, default=150, help="more VMs, whose jobs fail during the phases")
    parser.add_argument("--matching", type=int, default=5, help="subscriptions (of the 1,000) to job failures")
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each phase")
    parser.add_argument("--rounds", type=int, default=6, help="pairs of phases, one without and one with")
    parser.add_argument("--fail-every", type=float, default=2.0, help="seconds between two jobs' failures")
    add_load_args(parser)
    parser.add_argument("--database-url", default=os.environ.get(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/respawn_bench_notify"))
    parser.add_argument("--broker-url", default=os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--smoke", action="store_true",
                        help="4 agents, 4 failing jobs (two a phase), one round of 1 s phases: the suite's run that keeps the bench working")
    args = parser.parse_args(argv)
    if args.smoke:
        args.agents, args.failing, args.matching, args.seconds, args.rounds, args.fail_every = 4, 4, 2, 1.0, 1, 1.0
        args.clients, args.threads, args.web_workers, args.web_threads = 1, 2, 1, 2
    if not 2 <= args.matching <= SUBSCRIPTIONS:
        parser.error(f"--matching must be from 2 to {SUBSCRIPTIONS}")
    return args


def dead_endpoint() -> socket.socket:
    """Listens (so connecting succeeds) and never accepts: each request waits out its timeout."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    return sock


def subscribe(team, matching: int, live_url: str, dead_url: str, other_url: str) -> None:
    from respawn_server.jobs.core.choices import Channel, NotificationKind
    from respawn_server.jobs.models import Subscription

    others = [k for k in NotificationKind.SUBSCRIBABLE if k != NotificationKind.JOB_FAILED]
    rows = [Subscription(team=team, name="live", channel=Channel.SLACK, url=live_url,
                         events=[NotificationKind.JOB_FAILED]),
            Subscription(team=team, name="dead", channel=Channel.SLACK, url=dead_url,
                         events=[NotificationKind.JOB_FAILED])]
    rows += [Subscription(team=team, name=f"more-{i}", channel=Channel.SLACK, url=other_url,
                          events=[NotificationKind.JOB_FAILED]) for i in range(matching - 2)]
    rows += [Subscription(team=team, name=f"other-{i}", channel=Channel.SLACK, url=other_url,
                          events=[others[i % len(others)]]) for i in range(SUBSCRIPTIONS - len(rows))]
    Subscription.objects.bulk_create(rows)


def fail_jobs(url: str, tokens: list[str], every: float, until: float, failed: dict) -> None:
    """One job's VM reports a failed exit every `every` s; failed[job name] = when it was sent."""
    session = requests.Session()
    while tokens and time.time() < until:
        name, token = tokens.pop()
        failed[name] = time.time()
        answer = session.post(url + "/api/agent/v1/exit", timeout=30, headers={"Authorization": f"Bearer {token}"},
                              json={"event_id": str(uuid.uuid4()), "reason": "failed", "exit_code": 1,
                                    "last_exception": "RuntimeError: bench", "output_tail": "bench\n"})
        if answer.status_code != 200:
            failed[name] = f"exit report answered {answer.status_code}: {answer.text[:200]}"
        time.sleep(max(0.0, every - (time.time() - failed[name] if isinstance(failed[name], float) else 0)))


def start_worker(env: dict, log_path: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "celery", "-A", "respawn_server", "worker", "--pool", "threads",
                             "--concurrency", "8", "--loglevel", "WARNING", "--without-heartbeat", "--without-gossip",
                             "--without-mingle"], cwd=ROOT, env=env, stdout=open(log_path, "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.update(CELERY_BROKER_URL=args.broker_url, RESPAWN_BROKER_KEY_PREFIX=f"bench-notify-{os.getpid()}:",
                      RESPAWN_NOTIFY_ALLOW_PRIVATE="1", RESPAWN_NOTIFY_MAX_RETRIES="3", RESPAWN_NOTIFY_TIMEOUT_S="2")
    recreate_database(args.database_url)
    setup_django(args.database_url)
    from django.db import connections

    from respawn_server.jobs.models import Delivery, Job, Subscription, Team

    tokens, _ = make_agents(args.agents + args.failing)
    jobs = list(Job.objects.order_by("pk").values_list("name", flat=True))
    Job.objects.filter(name__in=jobs[args.agents:]).update(max_restarts=0)  # the first failure fails the job
    beating, failing = tokens[:args.agents], list(zip(jobs[args.agents:], tokens[args.agents:]))[::-1]
    team = Team.objects.get()
    parked = Team.objects.create(name="parked")
    connections.close_all()  # the client processes are forked: no shared connection
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    dead = dead_endpoint()
    web, url = start_web(args, tmp / f"bench-notify-web-{os.getpid()}.log")
    worker = start_worker({**os.environ, "DATABASE_URL": args.database_url},
                          tmp / f"bench-notify-worker-{os.getpid()}.log")
    phases: dict[str, Phase] = {"without": Phase(), "with": Phase()}
    failed_with: dict[str, float | str] = {}
    rates: list[str] = []
    seconds = {"without": 0.0, "with": 0.0}  # Phase.merge keeps one phase's length: the rounds add up here
    worker_cpu = {"without": 0.0, "with": 0.0}
    try:
        with Receiver() as receiver, multiprocessing.get_context("fork").Pool(args.clients) as pool:
            subscribe(parked, args.matching, receiver.url("/ok/live"), f"http://127.0.0.1:{dead.getsockname()[1]}/",
                      receiver.url("/ok/other"))
            # A B B A ...: a drift in the machine's speed over the run weighs on both sides alike.
            order = [name for i in range(args.rounds) for name in (("without", "with"), ("with", "without"))[i % 2]]
            for name in order:
                # The 1,000 move in and out of the failing jobs' team (deleting them would race their deliveries).
                Subscription.objects.update(team=team if name == "with" else parked)
                failed: dict = {}
                until = time.time() + 1.0 + args.seconds
                failer = threading.Thread(target=fail_jobs, args=(url, failing, args.fail_every, until, failed))
                failer.start()
                worker_before = cpu_s(worker.pid)
                phase = run_phase(pool, args, url, "heartbeat", beating)
                worker_cpu[name] += cpu_s(worker.pid) - worker_before
                rates.append(f"{'B' if name == 'with' else 'A'} {phase.rate:.0f}")
                phases[name].merge(phase)
                seconds[name] += phase.seconds
                failer.join()
                if name == "with":
                    failed_with.update(failed)
            arrivals = wait_for_arrivals(receiver, failed_with, timeout=60)
            dead_attempts = Delivery.objects.filter(subscription__name="dead").count()
    finally:
        stop_web(web)
        stop_web(worker)
        dead.close()

    without, with_ = phases["without"], phases["with"]
    without.seconds, with_.seconds = seconds["without"], seconds["with"]
    ratio = with_.rate / without.rate if without.rate else math.nan
    latencies = sorted(arrivals.values())
    refused = [f"{job}: {why}" for job, why in failed_with.items() if isinstance(why, str)]
    missing = [job for job, sent in failed_with.items() if isinstance(sent, float) and job not in arrivals]
    print(f"gunicorn {args.web_workers} workers x {args.web_threads} threads, a Celery worker (8 threads); "
          f"{args.clients * args.threads} concurrent heartbeats; {args.seconds:g} s a phase, "
          f"{', '.join(rates)} heartbeats/s (A without, B with); load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'no subscriptions':20s}: {without.rate:8.0f} heartbeats/s   p99 {ms(without.p99)}")
    print(f"{f'{SUBSCRIPTIONS:,} subscriptions':20s}: {with_.rate:8.0f} heartbeats/s   p99 {ms(with_.p99)}   "
          f"(ratio {ratio:.3f}, need >= {RATIO_MIN}); {args.matching} of them, one a dead endpoint, told of each "
          f"of {len(failed_with)} failures ({dead_attempts} deliveries to the dead one)")
    print(f"the Celery worker used {worker_cpu['without'] / seconds['without']:.3f} CPU s/s without, "
          f"{worker_cpu['with'] / seconds['with']:.3f} with")
    if latencies:
        p95 = latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))]
        print(f"failure -> webhook delivered: p50 {ms(statistics.median(latencies))}  p95 {ms(p95)}  "
              f"max {ms(latencies[-1])}  ({len(latencies)} failures)")
    failures = without.failures + with_.failures + refused
    misses = [f"failed requests, e.g. {failures[:3]}"] if failures else []
    if not ratio >= RATIO_MIN:  # NaN too: no heartbeat got through without
        misses.append(f"heartbeats/s with subscriptions is {ratio:.3f} of that without, below {RATIO_MIN}")
    if missing or not latencies:
        misses.append(f"no webhook arrived for {len(missing)} failed jobs, e.g. {missing[:3]}")
    for miss in misses:
        print("MISS:", miss)
    return 1 if args.check and misses else 0


def wait_for_arrivals(receiver: Receiver, failed: dict, *, timeout: float) -> dict[str, float]:
    """Job name -> seconds from its failure being reported to its webhook arriving at the live receiver."""
    deadline = time.monotonic() + timeout
    expected = {job for job, sent in failed.items() if isinstance(sent, float)}
    while True:
        arrivals = {}
        for message in receiver.at("/ok/live"):
            text = message.json()["text"]
            job = next((name for name in expected if f"Job {name} (#" in text), None)
            if job is not None:
                arrivals[job] = message.at - failed[job]
        if set(arrivals) >= expected or time.monotonic() > deadline:
            return arrivals
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
