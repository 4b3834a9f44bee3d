"""Heartbeats of thousands of agents against gunicorn + PostgreSQL, measured
against a trivial view (/healthz) on the same stack in the same run (issue 9).

Builds a fresh database (default `respawn_bench_heartbeats` on 127.0.0.1:5432)
with one running job and instance per simulated agent, each with its own agent
token, starts gunicorn on it, then drives it from client processes (threads with
keep-alive sessions, each request a closed loop):

  1. the trivial view: requests/s and p99;
  2. heartbeats, round-robin over every agent (a fresh event_id each, so every
     one is applied): heartbeats/s and p99, and how many agents at a 5 s
     interval that rate sustains;
  3. the dashboard pages (jobs list, a job page) signed in, idle and then while
     the heartbeat load of 2. runs.

    .venv/bin/python bench/heartbeats.py            # 2,000 agents, ~1.5 minutes
    .venv/bin/python bench/heartbeats.py --check    # exit 1 on a miss

--check exits 1 when heartbeats/s / trivial requests/s < 0.5, heartbeat p99 /
trivial p99 > 5, or any request failed.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.dashboard import recreate_database, setup_django  # noqa: E402  (after the path insert)

THROUGHPUT_RATIO_MIN = 0.5
P99_RATIO_MAX = 5.0
AGENT_INTERVAL_S = 5.0
BENCH_PASSWORD = "bench-heartbeats-password"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=2_000, help="simulated agents, each with its own token")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each timed phase")
    add_load_args(parser)
    parser.add_argument("--page-requests", type=int, default=40, help="timed requests per dashboard page")
    parser.add_argument("--database-url", default=os.environ.get(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/respawn_bench_heartbeats"))
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--smoke", action="store_true",
                        help="4 agents, 1 s phases, one web worker: the suite's run that keeps the bench working")
    args = parser.parse_args(argv)
    if args.smoke:
        args.agents, args.seconds, args.page_requests = 4, 1.0, 2
        args.clients, args.threads, args.web_workers, args.web_threads = 1, 2, 1, 2
    if args.agents < args.clients * args.threads:
        parser.error("need at least one agent per client thread")
    return args


def add_load_args(parser: argparse.ArgumentParser) -> None:
    """The client load and the gunicorn it drives (run_phase, start_web read them)."""
    parser.add_argument("--clients", type=int, default=2, help="client processes")
    parser.add_argument("--threads", type=int, default=8, help="concurrent requests per client process")
    parser.add_argument("--web-workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument("--web-threads", type=int, default=8, help="gunicorn threads per worker")


# ---- the agents -------------------------------------------------------------------------------

def make_agents(n: int) -> tuple[list[str], int]:
    """n running jobs with one registered instance each; returns their agent tokens and one job id."""
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.utils import timezone

    from respawn_server.jobs.core.choices import InstanceState, JobStatus
    from respawn_server.jobs.models import Instance, Job, Membership, Team
    from respawn_server.jobs.people.tokens import AGENT_PREFIX, new_token

    call_command("migrate", verbosity=0)
    team = Team.objects.create(name="bench", monthly_budget_usd=1_000_000, max_concurrent_gpus=n)
    user = User.objects.create_user("bench", password=BENCH_PASSWORD)
    Membership.objects.create(user=user, team=team, role="admin")
    jobs = Job.objects.bulk_create([
        Job(team=team, owner=user, name=f"agent-{i:05d}", command=["python", "train.py"], total_steps=10**9,
            status=JobStatus.RUNNING, checkpoint_uri="/tmp/bench-ckpt") for i in range(n)], batch_size=1_000)
    now = timezone.now()
    tokens, instances = [], []
    for job in jobs:
        token, digest = new_token(AGENT_PREFIX)
        tokens.append(token)
        instances.append(Instance(job=job, provider="local", region="local", zone="local-a", instance_type="cpu-small",
                                  state=InstanceState.RUNNING, running_at=now, registered_at=now,
                                  agent_token_hash=digest))
    Instance.objects.bulk_create(instances, batch_size=1_000)
    return tokens, jobs[0].pk


# ---- the server -------------------------------------------------------------------------------

def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_web(args, log_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "DATABASE_URL": args.database_url, "RESPAWN_LOG_LEVEL": "WARNING",
           "RESPAWN_HEARTBEAT_INTERVAL_S": str(AGENT_INTERVAL_S), "RESPAWN_LOGIN_RATE": "1000/min",
           "DJANGO_SECURE_COOKIES": "false"}  # plain HTTP on loopback: a Secure cookie would never come back
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "respawn_server.wsgi", "-b", f"127.0.0.1:{port}",
                             "--workers", str(args.web_workers), "--threads", str(args.web_threads),
                             "--keep-alive", "30"], cwd=ROOT, env=env, stdout=open(log_path, "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"gunicorn exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            if requests.get(url + "/healthz", timeout=1).ok:
                return proc, url
        except requests.RequestException:
            time.sleep(0.2)
    raise SystemExit(f"gunicorn did not answer on {url} within 60 s")


def stop_web(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# ---- the load ---------------------------------------------------------------------------------

@dataclass
class Phase:
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds

    @property
    def p99(self) -> float:
        # A phase whose every request failed has no latency to rank: its failures say why.
        if len(self.latencies) < 2:
            return math.nan
        return statistics.quantiles(self.latencies, n=100)[-1]

    def merge(self, other: "Phase") -> None:
        self.latencies += other.latencies
        self.failures += other.failures[:5]
        self.seconds = max(self.seconds, other.seconds)


def drive(url: str, kind: str, tokens: list[str], threads: int, start_at: float, seconds: float) -> Phase:
    """One client process: `threads` closed loops from start_at for `seconds` (wall clock, shared by all)."""
    phase, lock = Phase(seconds=seconds), threading.Lock()

    def loop(mine: list[str]):
        session = requests.Session()
        step, n = 0, 0
        while time.time() < start_at:
            time.sleep(0.001)
        while time.time() < start_at + seconds:
            begin = time.perf_counter()
            try:
                if kind == "trivial":
                    answer = session.get(url + "/healthz", timeout=30)
                else:
                    token = mine[n % len(mine)]
                    n += 1
                    step += 1
                    answer = session.post(url + "/api/agent/v1/heartbeat", timeout=30,
                                          headers={"Authorization": f"Bearer {token}"},
                                          json={"event_id": str(uuid.uuid4()), "step": step, "loss": 1.0 / step,
                                                "samples_per_s": 100.0})
            except requests.RequestException as exc:  # counted, not a silently dead loop
                with lock:
                    phase.failures.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            elapsed = time.perf_counter() - begin
            with lock:
                if answer.status_code == 200:
                    phase.latencies.append(elapsed)
                else:
                    phase.failures.append(f"{answer.status_code} {answer.text[:200]}")

    workers = [threading.Thread(target=loop, args=(tokens[i::threads],)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return phase


def run_phase(pool, args, url: str, kind: str, tokens: list[str]) -> Phase:
    start_at = time.time() + 1.0  # every client process starts together
    share = [tokens[i::args.clients] for i in range(args.clients)]
    results = [pool.apply_async(drive, (url, kind, share[i], args.threads, start_at, args.seconds))
               for i in range(args.clients)]
    total = Phase()
    for result in results:
        total.merge(result.get())
    return total


def time_pages(url: str, pages: dict[str, str], n: int) -> dict[str, Phase]:
    """Signed-in dashboard pages, one request at a time, as a person clicking."""
    session = requests.Session()
    login_page = session.get(url + "/login/")
    session.post(url + "/login/", data={"username": "bench", "password": BENCH_PASSWORD,
                                        "csrfmiddlewaretoken": login_page.cookies["csrftoken"]},
                 headers={"Referer": url + "/login/"})
    timed = {}
    for name, path in pages.items():
        phase, begin_all = Phase(), time.perf_counter()
        session.get(url + path)  # warm
        for _ in range(n):
            begin = time.perf_counter()
            answer = session.get(url + path, allow_redirects=False)
            if answer.status_code == 200:
                phase.latencies.append(time.perf_counter() - begin)
            else:
                phase.failures.append(f"{path}: {answer.status_code}")
        phase.seconds = time.perf_counter() - begin_all
        timed[name] = phase
    return timed


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def percentiles(phase: Phase) -> str:
    if len(phase.latencies) < 2:
        return f"FAILED ({phase.failures[:1]})"
    return f"p50 {ms(statistics.median(phase.latencies))} p99 {ms(phase.p99)}"


def main(argv=None) -> int:
    args = parse_args(argv)
    recreate_database(args.database_url)
    setup_django(args.database_url)
    begin = time.perf_counter()
    tokens, job_id = make_agents(args.agents)
    print(f"{args.agents:,} agents (jobs, instances, tokens) in {time.perf_counter() - begin:.0f} s")
    from django.db import connections

    connections.close_all()  # the client processes are forked: no shared connection
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-heartbeats-{os.getpid()}.log"
    web, url = start_web(args, log_path)
    try:
        with multiprocessing.get_context("fork").Pool(args.clients) as pool:
            trivial = run_phase(pool, args, url, "trivial", tokens)
            beats = run_phase(pool, args, url, "heartbeat", tokens)
            pages = {"jobs page": "/", "job page": f"/jobs/{job_id}/"}
            idle = time_pages(url, pages, args.page_requests)
            start_at = time.time() + 1.0
            loaded_beats = pool.apply_async(drive, (url, "heartbeat", tokens, args.threads * args.clients,
                                                    start_at, args.seconds))
            time.sleep(max(0.0, start_at - time.time()) + 1.0)  # pages once the load has begun
            loaded = time_pages(url, pages, args.page_requests)
            background = loaded_beats.get()
    finally:
        stop_web(web)

    throughput_ratio, p99_ratio = beats.rate / trivial.rate, beats.p99 / trivial.p99
    concurrency = args.clients * args.threads
    print(f"gunicorn {args.web_workers} workers x {args.web_threads} threads; {concurrency} concurrent "
          f"requests; {args.seconds:g} s a phase; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores "
          "(other work on the machine moves both sides of each ratio, not evenly)")
    print(f"trivial view  : {trivial.rate:8.0f} req/s   p99 {ms(trivial.p99)}")
    print(f"heartbeats    : {beats.rate:8.0f} req/s   p99 {ms(beats.p99)}   "
          f"(ratio {throughput_ratio:.2f}, need >= {THROUGHPUT_RATIO_MIN}; p99 ratio {p99_ratio:.2f}, "
          f"need <= {P99_RATIO_MAX})")
    print(f"sustains {beats.rate * AGENT_INTERVAL_S:,.0f} agents at a {AGENT_INTERVAL_S:g} s heartbeat interval")
    print(f"dashboard pages under {background.rate:.0f} heartbeats/s "
          f"(= {background.rate * AGENT_INTERVAL_S:,.0f} agents at {AGENT_INTERVAL_S:g} s):")
    for name in pages:
        print(f"  {name:10s}: idle {percentiles(idle[name])}; under load {percentiles(loaded[name])}")
    failures = trivial.failures + beats.failures + background.failures + [
        f for phase in (*idle.values(), *loaded.values()) for f in phase.failures]
    misses = [f"failed requests, e.g. {failures[:3]}"] if failures else []
    if throughput_ratio < THROUGHPUT_RATIO_MIN:
        misses.append(f"heartbeats/s is {throughput_ratio:.2f} of the trivial view's, below {THROUGHPUT_RATIO_MIN}")
    if p99_ratio > P99_RATIO_MAX:
        misses.append(f"heartbeat p99 is {p99_ratio:.2f}x the trivial view's, above {P99_RATIO_MAX}")
    for miss in misses:
        print("MISS:", miss)
    return 1 if args.check and misses else 0


if __name__ == "__main__":
    sys.exit(main())
