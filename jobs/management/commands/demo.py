"""`make demo`: one command that brings the whole control plane up on one laptop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import BaseCommand

from jobs.choices import JobStatus, Role
from jobs.cloud import provider_for
from jobs.models import ApiToken, Job, Membership, Team
from jobs.services import create_job
from jobs.tokens import PERSONAL_PREFIX, new_token

DEMO_USER, DEMO_PASSWORD, DEMO_TEAM = "demo", "demo-password", "demo"


def seed_demo() -> tuple[User, str, Job]:
    """A demo team, an admin user in it, a fresh API token and one queued job."""
    team, _ = Team.objects.get_or_create(name=DEMO_TEAM, defaults={"monthly_budget_usd": 500, "max_concurrent_gpus": 4})
    user, created = User.objects.get_or_create(username=DEMO_USER)
    if created:
        user.set_password(DEMO_PASSWORD)
        user.save()
    Membership.objects.get_or_create(user=user, team=team, defaults={"role": Role.ADMIN})
    token, digest = new_token(PERSONAL_PREFIX)
    ApiToken.objects.create(user=user, name="make demo", key_hash=digest, prefix=token[:8])
    unfinished = Job.objects.filter(team=team, name="demo: tiny classifier").exclude(status__in=JobStatus.TERMINAL)
    job = unfinished.first() or create_job(
        team=team, owner=user, name="demo: tiny classifier",
        # A short sleep per step stretches the tiny model's training over a couple of
        # minutes, so the simulated spot market preempts it a few times while you watch.
        command=[sys.executable, "-m", "agents.examples.tiny", "--step-delay", "0.03"],
        total_steps=3000, checkpoint_interval_s=5, allowed_clouds=["local"], instance_types=["cpu-small"],
        checkpoint_uri=str(settings.RESPAWN["DEFAULT_CHECKPOINT_URI"]),
        validation_model_factory="agents.examples.tiny:make_model",
        validation_batch_factory="agents.examples.tiny:validation_batch",
    )
    return user, token, job


class Command(BaseCommand):
    help = ("Migrate, seed a demo team/user/job, and run web + Celery worker + beat on this machine "
            "until Ctrl-C. Uses the embedded default (SQLite, filesystem broker) unless configured.")

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-serve", action="store_true", help="seed and print, start nothing (for tests)")

    def handle(self, *args, port: int, no_serve: bool, **options):
        call_command("migrate", interactive=False, verbosity=0)
        user, token, job = seed_demo()
        url = f"http://127.0.0.1:{port}"
        self.stdout.write(self.style.SUCCESS(f"Respawn is up at {url}/"))
        self.stdout.write(f"  log in as {DEMO_USER} / {DEMO_PASSWORD}")
        self.stdout.write(f"  API token (shown once): {token}")
        self.stdout.write(f"  try: curl -H 'Authorization: Bearer {token}' {url}/api/v1/jobs/")
        self.stdout.write(f"  API docs: {url}/api/docs/   demo job: #{job.pk} ({job.status})")
        if no_serve:
            return
        self._serve(port, url)

    def _serve(self, port: int, url: str) -> None:
        # Unless configured otherwise, the local spot market reclaims each VM 40 s after it
        # boots, with a 10 s notice: preemptions you can watch on the dashboard.
        env = {"RESPAWN_LOCAL_MARKET": "every", "RESPAWN_LOCAL_PREEMPT_EVERY_S": "40", "RESPAWN_LOCAL_NOTICE_S": "10",
               **os.environ, "RESPAWN_API_URL": url}
        python = sys.executable
        commands = {
            "web": [python, "-m", "gunicorn", "controlplane.wsgi", "-b", f"127.0.0.1:{port}", "--workers", "2",
                    "--threads", "4", "--access-logfile", "-"],
            "worker": [python, "-m", "celery", "-A", "controlplane", "worker", "--loglevel", "INFO",
                       "--concurrency", "2"],
            "beat": [python, "-m", "celery", "-A", "controlplane", "beat", "--loglevel", "INFO",
                     "-s", str(settings.VAR_DIR / "celerybeat-schedule")],
        }
        procs = {name: subprocess.Popen(argv, env=env) for name, argv in commands.items()}
        self.stdout.write(f"started {', '.join(f'{n} (pid {p.pid})' for n, p in procs.items())}; Ctrl-C stops them")
        stopping = False

        def stop(*_):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        while not stopping and all(p.poll() is None for p in procs.values()):
            time.sleep(0.5)
        for name, proc in procs.items():
            if proc.poll() is not None and not stopping:
                self.stderr.write(f"{name} exited with {proc.returncode}; stopping the others")
            if proc.poll() is None:
                proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        stopped = provider_for("local").terminate_all()
        self.stdout.write(f"demo stopped ({len(stopped)} local VM(s) terminated)")
