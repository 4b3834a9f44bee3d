"""Downtime of a noticed preemption when the replacement boots during the notice.

    python bench/downtime.py [--check] [--time-scale 2] [--boot-s 60] [--notice-s 120]

The embedded default, for real: a fresh SQLite database and the filesystem broker in
a temporary directory, gunicorn, a Celery worker and beat (subprocesses), and the local
provider booting real local VMs (supervisor + agent + the plain PyTorch example) that
take `--boot-s` to boot and get an AWS-like notice `--notice-s` before they are killed,
both divided by `--time-scale` (the market notices each VM 60 s, scaled, after its agent
starts). The trainer's own start (Python, PyTorch, the checkpoint's load) is not scaled:
it is the restore, which a spare does after the old VM's save, not during its notice. One job trains through its notices to the end; for each noticed preemption
that a spare took over (docs/spares.md), from the run's own records:

  downtime: the old VM's last step -> the spare's first step past its resume step
            (every step's time as the trainers reported it: one machine, one clock)
  save:     the old VM's last step -> its notice checkpoint's commit
  boot:     the spare requested -> registered (launch, boot delay, agent start)
  restore:  the spare's promotion (the old instance's end) -> its first step

save + boot + restore is what the preemption costs when done one after the other, the
way it was before the replacement launched on the notice.
--check: downtime / (save + boot + restore), summed over the noticed preemptions, <= 0.35.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.relaunch import embedded_env, unused_port  # noqa: E402  (after the path insert)

TARGET_RATIO = 0.35
STEPS, STEP_DELAY_S = 3000, 0.03


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help=f"exit 1 unless the ratio is <= {TARGET_RATIO}")
    parser.add_argument("--time-scale", type=float, default=2.0, help="divides the boot delay, notice and VM lifetime")
    parser.add_argument("--boot-s", type=float, default=60.0, help="a VM's boot before its agent starts (unscaled)")
    parser.add_argument("--notice-s", type=float, default=120.0, help="notice to the VM's end (unscaled; AWS: 120)")
    parser.add_argument("--time-limit-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.time_scale <= 0 or args.boot_s < 0 or args.notice_s <= 0:
        parser.error("--time-scale and --notice-s must be > 0, --boot-s >= 0")

    var_dir = Path(tempfile.mkdtemp(prefix="respawn-bench-downtime-"))
    port = unused_port()
    env = embedded_env(var_dir)
    env.update(RESPAWN_API_URL=f"http://127.0.0.1:{port}", RESPAWN_LOCAL_MARKET="every",
               RESPAWN_LOCAL_PREEMPT_EVERY_S=str(60.0 / args.time_scale),
               RESPAWN_LOCAL_NOTICE_S=str(args.notice_s / args.time_scale),
               RESPAWN_LOCAL_BOOT_DELAY_S=str(args.boot_s / args.time_scale), RESPAWN_NOTICE_BUDGET_S="3",
               RESPAWN_HEARTBEAT_INTERVAL_S="1", RESPAWN_HEARTBEAT_TIMEOUT_S="10", RESPAWN_RECONCILE_INTERVAL_S="1")
    os.environ.clear()  # this process must see the children's database, not one from the caller's environment
    os.environ.update(env)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: still stop the children and the VMs
    children = [_start(var_dir, env, name, argv) for name, argv in (
        ("web", [sys.executable, "-m", "gunicorn", "controlplane.wsgi", "-b", f"127.0.0.1:{port}", "-w", "2"]),
        ("worker", [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool", "threads",
                    "--concurrency", "4", "--without-heartbeat", "--without-gossip", "--without-mingle"]),
        ("beat", [sys.executable, "-m", "celery", "-A", "controlplane", "beat", "-s", str(var_dir / "beat")]))]
    try:
        job = _run_job(var_dir, args.time_limit_s)
    finally:
        for child in reversed(children):
            os.killpg(child.pid, signal.SIGTERM)  # gunicorn's and the worker's own children too
            child.wait(30)
        from django.conf import settings

        from jobs.fleet.providers.local import LocalConfig, LocalProvider

        LocalProvider(LocalConfig(root=settings.PROVIDER_CONFIG["local"]["root"])).terminate_all()
    rows = measure(job)
    print(f"job {job.pk}: {job.status} after {job.preemptions} preemption(s); notice {args.notice_s / args.time_scale:.0f}s, "
          f"boot delay {args.boot_s / args.time_scale:.0f}s (time scale 1/{args.time_scale:g}; {var_dir})")
    for row in rows:
        print(f"  instance {row['old']} -> spare {row['spare']}: downtime {row['downtime']:.2f}s; serial "
              f"save {row['save']:.2f}s + boot {row['boot']:.2f}s + restore {row['restore']:.2f}s; "
              f"parts as the job page shows them: {row['parts']}")
    if not rows:
        print("no noticed preemption was taken over by a spare: nothing to measure  OVER TARGET")
        return 1 if args.check else 0
    ratio = sum(r["downtime"] for r in rows) / sum(r["save"] + r["boot"] + r["restore"] for r in rows)
    verdict = ratio <= TARGET_RATIO
    print(f"downtime / (save + boot + restore): {ratio:.3f} (target <= {TARGET_RATIO})  "
          f"{'OK' if verdict else 'OVER TARGET'}")
    return 0 if verdict or not args.check else 1


def _start(var_dir: Path, env: dict, name: str, argv: list[str]) -> subprocess.Popen:
    log = open(var_dir / f"{name}.log", "ab")
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _run_job(var_dir: Path, time_limit_s: float):
    from django.contrib.auth.models import User

    from jobs.core.choices import JobStatus
    from jobs.models import Job, Membership, Team

    owner = User.objects.create_user("bench")
    team = Team.objects.create(name="bench")
    Membership.objects.create(user=owner, team=team, role="admin")
    job = Job.objects.create(
        team=team, owner=owner, name="downtime", total_steps=STEPS, checkpoint_uri=str(var_dir / "ckpt"),
        command=[sys.executable, "-m", "agents.examples.plain_pytorch", "--steps", str(STEPS), "--step-delay-s",
                 str(STEP_DELAY_S)],
        checkpoint_interval_s=10, allowed_clouds=["local"], instance_types=["cpu-small"], validation_enabled=False)
    give_up = time.monotonic() + time_limit_s
    while time.monotonic() < give_up:
        job.refresh_from_db()
        if job.status in JobStatus.TERMINAL:
            return job
        time.sleep(1)
    raise SystemExit(f"job {job.pk} still {job.status} after {time_limit_s:.0f}s ({var_dir})")


def measure(job) -> list[dict]:
    """Each noticed preemption whose slot a spare took over, from the database's records."""
    from jobs.models import Instance, StepPoint
    from jobs.money.downtime import job_downtime

    parts = {d.instance_id: {k: round(v, 2) for k, v in d.parts.items()}
             for d in job_downtime(job.pk, job.finished_at)[1]}
    rows = []
    for old in Instance.objects.filter(job=job, interruptions__kind="notice", ended_at__isnull=False).distinct():
        spare = Instance.objects.filter(job=job, rank=old.rank, pk__gt=old.pk, resume_checkpoint__instance=old,
                                        resume_checkpoint__kind="notice", requested_at__lt=old.ended_at).first()
        if spare is None:
            continue
        last = StepPoint.objects.filter(instance=old).order_by("-step").values_list("time", flat=True).first()
        first = StepPoint.objects.filter(instance=spare, step__gt=spare.resume_checkpoint.step).order_by(
            "step").values_list("time", flat=True).first()
        if last is None or first is None:
            continue
        rows.append({"old": old.pk, "spare": spare.pk, "downtime": (first - last).total_seconds(),
                     "save": (spare.resume_checkpoint.committed_at - last).total_seconds(),
                     "boot": (spare.registered_at - spare.requested_at).total_seconds(),
                     "restore": (first - old.ended_at).total_seconds(), "parts": parts.get(old.pk)})
    return rows


if __name__ == "__main__":
    sys.exit(main())
