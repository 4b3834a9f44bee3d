"""Downtime of a preemption: a replacement booted during the notice, and an elastic gang.

    python bench/downtime.py [--check] [--rows notice,elastic] [--time-scale 2] [--boot-s 60] [--notice-s 120]
                             [--trials 10]

The embedded default, for real: a fresh SQLite database and the filesystem broker in
a temporary directory, gunicorn, a Celery worker and beat (subprocesses), and the local
provider booting real local VMs (supervisor + agent + trainer) that take `--boot-s` to
boot, divided by `--time-scale`.

Row `notice`: VMs get an AWS-like notice `--notice-s` before they are killed (scaled;
the market notices each VM 60 s, scaled, after its agent starts), running the plain
PyTorch example. The trainer's own start (Python, PyTorch, the checkpoint's load) is not
scaled: it is the restore, which a spare does after the old VM's save, not during its
notice. One job trains through its notices to the end; for each noticed preemption
that a spare took over (docs/spares.md), from the run's own records:

  downtime: the old VM's last step -> the spare's first step past its resume step
            (every step's time as the trainers reported it: one machine, one clock)
  save:     the old VM's last step -> its notice checkpoint's commit
  boot:     the spare requested -> registered (launch, boot delay, agent start)
  restore:  the spare's promotion (the old instance's end) -> its first step

save + boot + restore is what the preemption costs when done one after the other, the
way it was before the replacement launched on the notice.
--check: downtime / (save + boot + restore), summed over the noticed preemptions, <= 0.35.

Row `elastic`: `--trials` times, a 3-node job (`respawn.examples.dcp_loop`, DDP over gloo,
sharded checkpoints) runs with a checkpoint, and one node's VM is killed outright
(SIGKILL to all its processes); timed from the kill to the first step a node reports
past the last step made before the kill (both arms redo the steps since their checkpoint
alike; a node's steps are recorded once, so a survivor's first step after it restarts is
not seen before that). Elastic (nodes 2..3): the two survivors regroup and go
on (docs/elastic.md); the baseline, in the same run, is the same job with nodes 3 only,
relaunched whole on 3 new VMs. --check: p95 elastic / p95 whole relaunch <= 0.5.

Row `validation` (after `notice`, whose downtime it is set against): the agent's
validator (respawn.agent.validation), warm as on a VM (started with the job, ready
before the checkpoint lands), checks a fresh checkpoint of the demo's model
(respawn.examples.tiny, `make demo`'s job), `--trials` times; the baseline, in the same
run, is the way before: a fresh process per checkpoint. Timed from the checkpoint's
submission to its verdict. --check: the warm check's median <= 0.2 of the notice row's
median downtime, and at a state of >= 1 GiB (the same model, TINY_HIDDEN wide) <= 2
training steps' time (the median step, measured in the same run).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.relaunch import age, embedded_env, p95, unused_port  # noqa: E402  (after the path insert)

TARGET_RATIO = 0.35
TARGET_ELASTIC = 0.5
TARGET_VALIDATION_SHARE, TARGET_VALIDATION_STEPS = 0.2, 2.0
BIG_HIDDEN = 9600  # tiny's hidden width for a state (weights and Adam's moments) of >= 1 GiB
STEPS, STEP_DELAY_S = 3000, 0.03
SMOKE_STEPS = 60
NODES = 3
ELASTIC_TRAIN = [sys.executable, "-m", "respawn.examples.dcp_loop", "--wrap", "ddp", "--steps", "1000000", "--every",
                 "10", "--global-batch", "6", "--step-delay", "0.05"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 unless notice <= {TARGET_RATIO} and elastic <= {TARGET_ELASTIC}")
    parser.add_argument("--rows", default="notice,validation,elastic", help="which rows to measure, comma-separated")
    parser.add_argument("--time-scale", type=float, default=2.0, help="divides the boot delay, notice and VM lifetime")
    parser.add_argument("--boot-s", type=float, default=60.0, help="a VM's boot before its agent starts (unscaled)")
    parser.add_argument("--notice-s", type=float, default=120.0, help="notice to the VM's end (unscaled; AWS: 120)")
    parser.add_argument("--trials", type=int, default=10, help="kills per arm of the elastic row, checks per arm of validation")
    parser.add_argument("--time-limit-s", type=float, default=600.0, help="per job")
    parser.add_argument("--smoke", action="store_true", help="the notice row's job cut to 60 steps, done before its "
                        "first notice, VMs booting at once: the suite's run that keeps the bench working")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rows, args.time_scale, args.boot_s, args.time_limit_s = "notice", 1.0, 0.0, 120.0
    rows = set(args.rows.split(","))
    if args.time_scale <= 0 or args.boot_s < 0 or args.notice_s <= 0 or args.trials < 1 or not rows or \
            rows - {"notice", "validation", "elastic"} or "validation" in rows and "notice" not in rows:
        parser.error("--time-scale, --notice-s and --trials must be > 0, --boot-s >= 0, --rows of notice, validation "
                     "(with notice), elastic")

    var_dir = Path(tempfile.mkdtemp(prefix="respawn-bench-downtime-"))
    port = unused_port()
    env = embedded_env(var_dir)
    env.update(RESPAWN_API_URL=f"http://127.0.0.1:{port}", RESPAWN_LOCAL_BOOT_DELAY_S=str(args.boot_s / args.time_scale),
               RESPAWN_NOTICE_BUDGET_S="3", RESPAWN_HEARTBEAT_INTERVAL_S="1", RESPAWN_HEARTBEAT_TIMEOUT_S="10",
               RESPAWN_RECONCILE_INTERVAL_S="1")
    os.environ.clear()  # this process must see the children's database, not one from the caller's environment
    os.environ.update(env)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: still stop the children and the VMs
    print(f"boot delay {args.boot_s / args.time_scale:.0f}s (time scale 1/{args.time_scale:g}; {var_dir})")
    verdicts = []
    if "notice" in rows:
        market = dict(RESPAWN_LOCAL_MARKET="every", RESPAWN_LOCAL_PREEMPT_EVERY_S=str(60.0 / args.time_scale),
                      RESPAWN_LOCAL_NOTICE_S=str(args.notice_s / args.time_scale))
        with control_plane(var_dir, {**env, **market}, port):
            job = _run_job(var_dir, args.time_limit_s, SMOKE_STEPS if args.smoke else STEPS)
        verdicts.append(notice_row(job, args.notice_s / args.time_scale))
    if "validation" in rows:
        downtimes = [row["downtime"] for row in measure(job)]
        verdicts.append(bool(downtimes) and validation_row(var_dir, statistics.median(downtimes), min(args.trials, 2)))
    if "elastic" in rows:
        with control_plane(var_dir, env, port):
            verdicts.append(elastic_row(var_dir, args.trials, args.time_limit_s))
    return 0 if all(verdicts) or not args.check else 1


@contextlib.contextmanager
def control_plane(var_dir: Path, env: dict, port: int):
    """Web, worker and beat with `env`; on the way out they stop, and so does every local VM."""
    children = [_start(var_dir, env, name, argv) for name, argv in (
        ("web", [sys.executable, "-m", "gunicorn", "respawn_server.wsgi", "-b", f"127.0.0.1:{port}", "-w", "2"]),
        ("worker", [sys.executable, "-m", "celery", "-A", "respawn_server", "worker", "--pool", "threads",
                    "--concurrency", "4", "--without-heartbeat", "--without-gossip", "--without-mingle"]),
        ("beat", [sys.executable, "-m", "celery", "-A", "respawn_server", "beat", "-s", str(var_dir / "beat")]))]
    try:
        yield
    finally:
        for child in reversed(children):
            os.killpg(child.pid, signal.SIGTERM)  # gunicorn's and the worker's own children too
            child.wait(30)
        _local_vms().terminate_all()


def _local_vms():
    from django.conf import settings

    from respawn_server.jobs.fleet.providers.local import LocalConfig, LocalProvider

    return LocalProvider(LocalConfig(root=settings.PROVIDER_CONFIG["local"]["root"]))


def notice_row(job, notice_s: float) -> bool:
    rows = measure(job)
    print(f"notice: job {job.pk}: {job.status} after {job.preemptions} preemption(s); notice {notice_s:.0f}s")
    for row in rows:
        print(f"  instance {row['old']} -> spare {row['spare']}: downtime {row['downtime']:.2f}s; serial "
              f"save {row['save']:.2f}s + boot {row['boot']:.2f}s + restore {row['restore']:.2f}s; "
              f"parts as the job page shows them: {row['parts']}")
    if not rows:
        print("no noticed preemption was taken over by a spare: nothing to measure  OVER TARGET")
        return False
    ratio = sum(r["downtime"] for r in rows) / sum(r["save"] + r["boot"] + r["restore"] for r in rows)
    verdict = ratio <= TARGET_RATIO
    print(f"downtime / (save + boot + restore): {ratio:.3f} (target <= {TARGET_RATIO})  "
          f"{'OK' if verdict else 'OVER TARGET'}")
    return verdict


def elastic_row(var_dir: Path, trials: int, time_limit_s: float) -> bool:
    """Alternate the two arms, `trials` kills each, on the same machine in the same run."""
    team, owner = _team()
    times: dict[str, list[float]] = {"elastic": [], "whole": []}
    for trial in range(trials):
        for arm in times:
            seconds = _kill_one_node(var_dir, team, owner, elastic=arm == "elastic", time_limit_s=time_limit_s)
            times[arm].append(seconds)
            print(f"  trial {trial + 1} {arm}: training again {seconds:.2f}s after the kill", flush=True)
    elastic, whole = p95(times["elastic"]), p95(times["whole"])
    ratio = elastic / whole
    verdict = ratio <= TARGET_ELASTIC
    print(f"elastic: one of {NODES} local nodes killed -> training again, p95 over {trials} trials: on the 2 "
          f"survivors {elastic:.2f}s, relaunched whole on {NODES} {whole:.2f}s (medians "
          f"{statistics.median(times['elastic']):.2f}s, {statistics.median(times['whole']):.2f}s)")
    print(f"elastic / whole relaunch (p95): {ratio:.3f} (target <= {TARGET_ELASTIC})  "
          f"{'OK' if verdict else 'OVER TARGET'}")
    return verdict


def validation_row(var_dir: Path, downtime_s: float, trials: int) -> bool:
    small = _validation_times(var_dir / "small", {}, trials)
    share = small["warm"] / downtime_s
    print(f"validation, the demo's model: warm {small['warm']:.2f}s (a fresh process each, the way before: "
          f"{small['one-shot']:.2f}s), medians of {trials}; {share:.3f} of a noticed interruption's "
          f"{downtime_s:.2f}s downtime (target <= {TARGET_VALIDATION_SHARE})  "
          f"{'OK' if share <= TARGET_VALIDATION_SHARE else 'OVER TARGET'}")
    big = _validation_times(var_dir / "big", {"TINY_HIDDEN": str(BIG_HIDDEN)}, trials)
    steps = big["warm"] / big["step_s"]
    print(f"validation at {big['bytes'] / 2**30:.2f} GiB: warm {big['warm']:.2f}s (a fresh process each: "
          f"{big['one-shot']:.2f}s) = {steps:.2f} training steps of {big['step_s']:.2f}s "
          f"(target <= {TARGET_VALIDATION_STEPS:g}, at >= 1 GiB)  "
          f"{'OK' if steps <= TARGET_VALIDATION_STEPS and big['bytes'] >= 2**30 else 'OVER TARGET'}")
    return share <= TARGET_VALIDATION_SHARE and steps <= TARGET_VALIDATION_STEPS and big["bytes"] >= 2**30


def _validation_times(folder: Path, extra_env: dict, trials: int) -> dict:
    """Median seconds from submitting a fresh checkpoint to its verdict, for the warm
    validator and for a fresh process per checkpoint, plus the training step's median
    seconds and the checkpoint's bytes."""
    import json

    from respawn import protocol
    from respawn.agent.validation import DEFAULT_COMMAND, SERVE_COMMAND, Validator
    from respawn.examples import tiny

    env = {**os.environ, **extra_env}
    spec = protocol.ValidationSpec(model_factory=tiny.VALIDATION.model_factory, batch_factory=tiny.VALIDATION.batch_factory,
                                   tolerance=tiny.VALIDATION.tolerance)
    times: dict[str, list[float]] = {"warm": [], "one-shot": []}
    step_times = []
    for trial in range(trials):
        uri = str(folder / f"trial-{trial}")
        made = subprocess.run([sys.executable, str(ROOT / "bench" / "helpers" / "tiny_checkpoint.py"), uri, "3"], env=env, cwd=ROOT,
                              capture_output=True, text=True, check=True)
        step_times.append(json.loads(made.stdout.splitlines()[-1])["step_s"])
        report = protocol.CheckpointReport(checkpoint_id=f"trial-{trial}", step=3, uri=f"{uri}/step-00000003", bytes=0,
                                           manifest_digest="")
        for arm, serve in (("warm", SERVE_COMMAND), ("one-shot", "")):
            verdicts = []
            validator = Validator(command=DEFAULT_COMMAND, serve_command=serve, spec=spec, env=env, cwd=str(ROOT),
                                  on_result=lambda _, verdict: verdicts.append((time.monotonic(), verdict)))
            if serve:
                _wait(validator.warm, 120, "the warm validator", interval=0.005)
            (Path(uri) / "step-00000003" / "VALIDATION.json").unlink(missing_ok=True)
            submitted = time.monotonic()
            validator.submit(report)
            _wait(lambda: validator.poll() or verdicts, 300, f"the {arm} validator's verdict", interval=0.005)
            validator.stop()
            if verdicts[0][1].result != "valid":
                raise SystemExit(f"{arm} validation of {report.uri}: {verdicts[0][1]}")
            times[arm].append(verdicts[0][0] - submitted)
    size = sum(p.stat().st_size for p in (folder / "trial-0" / "step-00000003").iterdir())
    return {arm: statistics.median(t) for arm, t in times.items()} | {"step_s": statistics.median(step_times),
                                                                      "bytes": size}


def _team():
    from django.contrib.auth.models import User

    from respawn_server.jobs.models import Membership, Team

    owner, _ = User.objects.get_or_create(username="bench")
    team, _ = Team.objects.get_or_create(name="bench")
    Membership.objects.get_or_create(user=owner, team=team, defaults={"role": "admin"})
    return team, owner


def _kill_one_node(var_dir: Path, team, owner, *, elastic: bool, time_limit_s: float) -> float:
    """Seconds from killing rank 1's VM of a fresh 3-node job (once it runs with a
    checkpoint) to the first step reported past the last one before the kill. The job
    is cancelled afterwards and its VMs gone before the next trial."""
    from django.db.models import Max
    from django.utils import timezone

    from respawn_server.jobs.core.choices import InstanceState, JobStatus
    from respawn_server.jobs.core.services import cancel_job
    from respawn_server.jobs.models import Checkpoint, Instance, Job, StepPoint, WorldSize

    job = Job.objects.create(
        team=team, owner=owner, name=f"{'elastic' if elastic else 'whole'}-gang", nodes=NODES,
        nodes_min=NODES - 1 if elastic else None, total_steps=1000000, checkpoint_uri=str(var_dir / "ckpt"),
        command=ELASTIC_TRAIN, allowed_clouds=["local"], instance_types=["cpu-small"], validation_enabled=False)
    _wait(lambda: Job.objects.get(pk=job.pk).status == JobStatus.RUNNING and Checkpoint.objects.filter(
        job=job, step__gt=0).exists(), time_limit_s, f"job {job.pk} to run with a checkpoint")
    first = list(Instance.objects.filter(job=job, state=InstanceState.RUNNING).order_by("rank"))
    killed_at = timezone.now()
    for pid in _local_vms().processes(first[1].provider_instance_id):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def training_again():
        # The first step past where training was before the kill, as the trainers report each
        # step (a node's steps are recorded once): both arms resume from a checkpoint at or
        # before it and redo the steps since alike.
        if elastic:  # the survivors, once regrouped (a whole relaunch would be a failed trial)
            regrouped = WorldSize.objects.filter(job=job, world_size=NODES - 1).values_list("at", flat=True).first()
            if regrouped is None:
                return None
            points = StepPoint.objects.filter(job=job, instance__in=first, time__gt=regrouped)
        else:
            reached = StepPoint.objects.filter(job=job, instance__in=first).aggregate(step=Max("step"))["step"] or 0
            points = StepPoint.objects.filter(job=job, time__gt=killed_at, step__gt=reached).exclude(instance__in=first)
        return points.order_by("time").values_list("time", flat=True).first()

    _wait(training_again, time_limit_s, f"job {job.pk} to train again after the kill")
    seconds = (training_again() - killed_at).total_seconds()
    if elastic and Instance.objects.filter(job=job).count() != NODES:
        raise SystemExit(f"job {job.pk}: the elastic gang was relaunched rather than going on ({var_dir})")
    cancel_job(job, by=owner)
    _wait(lambda: Job.objects.get(pk=job.pk).status in JobStatus.TERMINAL and not Instance.objects.filter(
        job=job, state__in=InstanceState.LIVE).exists(), time_limit_s, f"job {job.pk} to stop")
    # The bench killed that VM, not the cloud: it must not steer the next trials' placement
    # (the policy counts confirmed preemptions against a zone, and backs off after bursts).
    job.instances.filter(preemption_confirmed=True).update(preemption_confirmed=False)
    age(job.instances.values_list("pk", flat=True))
    return seconds


def _wait(predicate, time_limit_s: float, what: str, interval: float = 0.2) -> None:
    give_up = time.monotonic() + time_limit_s
    while not predicate():
        if time.monotonic() > give_up:
            raise SystemExit(f"gave up after {time_limit_s:.0f}s waiting for {what}")
        time.sleep(interval)


def _start(var_dir: Path, env: dict, name: str, argv: list[str]) -> subprocess.Popen:
    log = open(var_dir / f"{name}.log", "ab")
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _run_job(var_dir: Path, time_limit_s: float, steps: int):
    from respawn_server.jobs.core.choices import JobStatus
    from respawn_server.jobs.models import Job

    team, owner = _team()
    job = Job.objects.create(
        team=team, owner=owner, name="downtime", total_steps=steps, checkpoint_uri=str(var_dir / "ckpt"),
        command=[sys.executable, "-m", "respawn.examples.plain_pytorch", "--steps", str(steps), "--step-delay-s",
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
    from respawn_server.jobs.models import Instance, StepPoint
    from respawn_server.jobs.money.downtime import job_downtime

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
