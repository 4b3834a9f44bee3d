"""`make demo`: one command that brings the whole control plane up on one laptop."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

import requests
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from respawn_server.jobs.core.choices import JobStatus, Role
from respawn_server.jobs.core.services import create_job
from respawn_server.jobs.fleet.launcher import terminate_local_vms
from respawn_server.jobs.management.children import Child
from respawn_server.jobs.models import ApiToken, Job, Membership, Team
from respawn_server.jobs.people.tokens import PERSONAL_PREFIX, new_token

DEMO_USER, DEMO_PASSWORD, DEMO_TEAM = "demo", "demo-password", "demo"
WEB_START_TIMEOUT_S = 60.0
GRACE_S = 10  # how long web, worker and beat each get to stop before their process group is killed
POLL_S = 0.2


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
        # A sleep per step stretches the tiny model's training over about ten minutes,
        # so the simulated spot market (_serve) preempts it a few times while you watch.
        command=[sys.executable, "-m", "respawn.examples.tiny", "--step-delay", "0.1"],
        total_steps=4500, checkpoint_interval_s=10, allowed_clouds=["local"], instance_types=["cpu-small"],
        checkpoint_uri=str(settings.RESPAWN["DEFAULT_CHECKPOINT_URI"]),
        validation_model_factory="respawn.examples.tiny:make_model",
        validation_batch_factory="respawn.examples.tiny:validation_batch",
    )
    return user, token, job


class Command(BaseCommand):
    help = ("Migrate, seed a demo team/user/job, and run web + Celery worker + beat on this machine "
            "until Ctrl-C (their logs in var/logs/). Uses the embedded default (SQLite, filesystem broker) "
            "unless configured.")

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-serve", action="store_true", help="seed and print, start nothing (for tests)")

    def handle(self, *args, port: int, no_serve: bool, **options):
        # Celery's filesystem broker has no host, and kombu warns so on each message this
        # process sends (submitting the demo job, stopping its VMs): noise on the terminal.
        logging.getLogger("kombu.connection").setLevel(logging.ERROR)
        call_command("migrate", interactive=False, verbosity=0)
        user, token, job = seed_demo()
        url = f"http://127.0.0.1:{port}"
        if no_serve:
            self._welcome(url, token, job)
            return
        Demo(self, url, port).run(lambda: self._welcome(url, token, job))

    def _welcome(self, url: str, token: str, job: Job) -> None:
        self.stdout.write(f"  log in as {DEMO_USER} / {DEMO_PASSWORD}")
        self.stdout.write(f"  API token (shown once): {token}")
        self.stdout.write(f"  try: curl -H 'Authorization: Bearer {token}' {url}/api/v1/jobs/")
        self.stdout.write(f"  API docs: {url}/api/docs/")
        self.stdout.write(f"  demo job #{job.pk}: {url}/jobs/{job.pk}/")


class Demo:
    """Web, worker and beat until Ctrl-C (or SIGTERM), then every one of them and
    every local VM stopped: nothing outlives the command."""

    def __init__(self, command: BaseCommand, url: str, port: int):
        self.out, self.style = command.stdout, command.style
        self.url, self.port = url, port
        self.logs = settings.VAR_DIR / "logs"
        self.stopping = False
        self.failure = ""
        self.children: dict[str, Child] = {}

    def run(self, welcome) -> None:
        signal.signal(signal.SIGINT, self._stop)
        signal.signal(signal.SIGTERM, self._stop)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.logs.chmod(0o700)  # the control plane's; local VMs run by root pass through var/ to their own folders
        try:
            self._start()
            if self._wait(self._answers, WEB_START_TIMEOUT_S):
                self.out.write(self.style.SUCCESS(f"Respawn is up at {self.url}/"))
                welcome()
                self.out.write("Ctrl-C stops web, worker, beat and every local VM.")
                self._wait(lambda: False, None)
            elif not self.stopping and not self.failure:
                self.failure = (f"the web server did not answer on {self.url} within {WEB_START_TIMEOUT_S:.0f}s "
                                f"(see {self.logs / 'web.log'})")
        finally:
            self._shut_down()
        if self.failure:
            raise CommandError(self.failure)

    def _stop(self, signum, frame) -> None:
        self.stopping = True

    def _start(self) -> None:
        # Unless configured otherwise, the local spot market reclaims each VM 120 s after
        # it boots, with a 10 s notice: preemptions you can watch on the dashboard.
        env = {"RESPAWN_LOCAL_MARKET": "every", "RESPAWN_LOCAL_PREEMPT_EVERY_S": "120",
               "RESPAWN_LOCAL_NOTICE_S": "10", **os.environ, "RESPAWN_API_URL": self.url}
        python = sys.executable
        celery = [python, "-m", "celery", "-A", "respawn_server"]
        commands = {
            "web": [python, "-m", "gunicorn", "respawn_server.wsgi", "-b", f"127.0.0.1:{self.port}", "--workers", "2",
                    "--threads", "4", "--graceful-timeout", str(GRACE_S),
                    "--access-logfile", str(self.logs / "web-access.log")],
            "worker": [*celery, "worker", "--loglevel", "INFO", "--concurrency", "2"],
            "beat": [*celery, "beat", "--loglevel", "INFO", "-s", str(settings.VAR_DIR / "celerybeat-schedule")],
        }
        for name, argv in commands.items():
            self.children[name] = Child(argv, env=env, log_path=self.logs / f"{name}.log")
        self.out.write("started " + ", ".join(f"{name} (pid {child.pid})" for name, child in self.children.items())
                       + f"; their logs are in {self.logs}/, each local VM's in "
                       + f"{settings.RESPAWN['PROVIDER_CONFIG']['local']['root']}/<vm>/")

    def _wait(self, done, timeout_s: float | None) -> bool:
        """Until `done()`; False on Ctrl-C, a child's exit or the timeout."""
        give_up = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.stopping:
            if done():
                return True
            for name, child in self.children.items():
                if child.exited():
                    self.failure = f"{name} exited (see {child.log_path})"
                    return False
            if give_up is not None and time.monotonic() > give_up:
                return False
            time.sleep(POLL_S)
        return False

    def _answers(self) -> bool:
        try:
            return requests.get(f"{self.url}/healthz", timeout=1).ok
        except requests.RequestException:
            return False

    def _shut_down(self) -> None:
        """Beat and the worker first, so nothing launches a VM any more; then the local
        VMs, while the API still takes their last checkpoints; the web server last."""
        self.stopping = True
        self.out.write("stopping...")
        schedulers = [self.children[name] for name in ("beat", "worker") if name in self.children]
        for child in schedulers:
            child.terminate()
        for child in schedulers:
            child.stop(timeout_s=GRACE_S)
        try:
            vms = terminate_local_vms() if "local" in settings.RESPAWN["PROVIDERS"] else []
        finally:
            if "web" in self.children:
                self.children["web"].stop(timeout_s=GRACE_S)
        resume = f": {len(vms)} local VM(s) terminated, their jobs resume from their newest checkpoint next time"
        self.out.write("demo stopped" + (resume if vms else ""))
