"""A plain PyTorch training script that is spot-safe without Respawn's library.

It shows the whole framework-agnostic contract (agents/respawn/protocol.py, end):
- reads its checkpoint directory, resume point, interval and step count from
  RESPAWN_* variables (all optional: it also runs on its own);
- SIGTERM (or the agent's notice file) means "checkpoint now and stop",
  SIGUSR1 "checkpoint now"; a handler only sets a flag, the loop acts on it;
- saves model, optimizer, step and RNG state with torch.save into a temp file,
  fsync, rename (a checkpoint exists only once complete), then appends one JSON
  line per commit to RESPAWN_CHECKPOINTS_FILE and keeps RESPAWN_STATUS_FILE
  current (replaced atomically) so the agent can heartbeat and report, and appends
  every step's loss to RESPAWN_METRICS_FILE for the job's loss curve;
- logs its loss by step to W&B and/or MLflow when the environment names them
  (WANDB_PROJECT or WANDB_MODE; MLFLOW_TRACKING_URI): the agent sets WANDB_RUN_ID,
  WANDB_RESUME and MLFLOW_RUN_ID to the job's one run, which `wandb.init()` and
  `mlflow.start_run()` read themselves, and the script logs only the steps after the
  one it resumed at, so a relaunched job's run holds each step once.

Run: `python -m respawn.examples.plain_pytorch --steps 500` (checkpoints in
./checkpoints unless RESPAWN_CHECKPOINT_URI says otherwise). Kill it any way you
like and run it again: it continues from its newest checkpoint with the same
loss trajectory as an uninterrupted run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import torch
import xxhash
import torch.nn.functional as F
from torch import nn

FEATURES, CLASSES = 32, 8
requests_ = {"checkpoint": False, "stop": False}


def on_signal(signum, frame) -> None:
    requests_["stop" if signum == signal.SIGTERM else "checkpoint"] = True


def make_model(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, CLASSES))


def batch_for(step: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The data of step `step`, a pure function of it, so resuming needs no sampler state."""
    g = torch.Generator().manual_seed(10_000 + step)
    x = torch.randn(batch, FEATURES, generator=g)
    return x, (x[:, :CLASSES].argmax(dim=1))


def checkpoint_payload(model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> dict:
    return {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state()}


def restore(payload: dict, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    model.load_state_dict(payload["model"])
    if "optimizer" in payload:
        optimizer.load_state_dict(payload["optimizer"])
    torch.set_rng_state(payload["torch_rng"])
    return payload["step"]


def checkpoint_dir() -> Path:
    uri = os.environ.get("RESPAWN_CHECKPOINT_URI") or "checkpoints"
    path = Path(uri.removeprefix("file://"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def newest_checkpoint(directory: Path) -> Path | None:
    resume = os.environ.get("RESPAWN_RESUME_FROM")
    if resume:
        return Path(resume.removeprefix("file://"))
    found = sorted(directory.glob("step-*.pt"))
    return found[-1] if found else None


class DigestingFile:
    """A file that digests what is written to it, so the checkpoint is not read back to hash it."""

    def __init__(self, f):
        self.f, self.digest = f, xxhash.xxh3_128()

    def write(self, data) -> int:
        self.digest.update(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def save(directory: Path, payload: dict, kind: str, started: float) -> dict:
    path = directory / f"step-{payload['step']:08d}.pt"
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        out = DigestingFile(f)
        torch.save(payload, out)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(directory, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    record = {
        "checkpoint_id": str(uuid.uuid4()),
        "step": payload["step"],
        "uri": str(path),
        "bytes": path.stat().st_size,
        "manifest_digest": "xxh3_128:" + out.digest.hexdigest(),
        "kind": kind,
        "committed_at": datetime.now(timezone.utc).isoformat(),
        "save_s": time.monotonic() - started,
    }
    if os.environ.get("RESPAWN_CHECKPOINTS_FILE"):
        with open(os.environ["RESPAWN_CHECKPOINTS_FILE"], "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
    return record


def write_status(body: dict) -> None:
    path = os.environ.get("RESPAWN_STATUS_FILE")
    if path:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(body, f)
        os.replace(tmp, path)


def append_metric(step: int, loss: float, samples_per_s: float) -> None:
    """Every step for the job's loss curve: one JSON line, appended (the status file
    holds only the newest). Opened per call here for brevity; keep it open in a hot loop."""
    path = os.environ.get("RESPAWN_METRICS_FILE")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"step": step, "loss": loss, "samples_per_s": samples_per_s, "time": time.time()}) + "\n")


def read_interval(default: float) -> float:
    path = os.environ.get("RESPAWN_CONTROL_FILE")
    try:
        return float(json.loads(Path(path).read_text())["checkpoint_interval_s"]) if path else default
    except (OSError, ValueError, KeyError, TypeError):
        return default


def notice_given() -> bool:
    path = os.environ.get("RESPAWN_NOTICE_FILE")
    return bool(path) and os.path.exists(path)


class Trackers:
    """The experiment trackers the environment names; none when it names none."""

    def __init__(self, config: dict):
        self.wandb_run = self.mlflow = None
        if os.environ.get("WANDB_PROJECT") or os.environ.get("WANDB_MODE"):
            import wandb

            self.wandb_run = wandb.init(config=config)
        if os.environ.get("MLFLOW_TRACKING_URI"):
            import mlflow

            mlflow.start_run()
            self.mlflow = mlflow

    def log(self, step: int, loss: float) -> None:
        if self.wandb_run is not None:
            self.wandb_run.log({"loss": loss}, step=step)
        if self.mlflow is not None:
            self.mlflow.log_metric("loss", loss, step=step)

    def close(self) -> None:
        if self.wandb_run is not None:
            self.wandb_run.finish()
        if self.mlflow is not None:
            self.mlflow.end_run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=int(os.environ.get("RESPAWN_TOTAL_STEPS") or 500))
    parser.add_argument("--hidden", type=int, default=64, help="hidden width (4096: ~200 MB of weights and Adam state)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--step-delay-s", type=float, default=0.0, help="sleep per step, to stretch a demo")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGUSR1, on_signal)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.serialization.set_crc32_options(False)  # the xxh3 digest covers the file; a second checksum only slows the notice save
    torch.manual_seed(0)

    model = make_model(args.hidden)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, fused=True)  # one kernel per step: short steps, prompt notice saves
    directory = checkpoint_dir()
    step = 0
    if (resume := newest_checkpoint(directory)) is not None:
        step = restore(torch.load(resume, weights_only=False), model, optimizer)
        print(f"resumed from {resume} at step {step}", flush=True)
    if step >= args.steps:
        print(f"already trained to step {step}", flush=True)
        return 0
    trackers = Trackers(vars(args))
    try:
        return train(args, model, optimizer, directory, step, resume is not None, trackers)
    finally:
        trackers.close()


def train(args, model, optimizer, directory: Path, step: int, resumed: bool, trackers: Trackers) -> int:
    interval = float(os.environ.get("RESPAWN_CHECKPOINT_INTERVAL_S") or 30)
    last_save = time.monotonic()
    last_ckpt_step = step if resumed else None
    while step < args.steps:
        started = time.monotonic()
        x, y = batch_for(step, args.batch)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        step += 1
        trackers.log(step, loss.item())
        speed = args.batch / max(time.monotonic() - started, 1e-9)
        write_status({"step": step, "loss": loss.item(), "samples_per_s": speed, "last_checkpoint_step": last_ckpt_step})
        append_metric(step, loss.item(), speed)
        if args.step_delay_s:
            time.sleep(args.step_delay_s)
        stop = requests_["stop"] or notice_given()
        if stop or requests_["checkpoint"] or time.monotonic() - last_save >= read_interval(interval):
            kind = "notice" if notice_given() else "periodic"
            record = save(directory, checkpoint_payload(model, optimizer, step), kind, time.monotonic())
            print(f"checkpoint {record['kind']} at step {step}: {record['uri']}", flush=True)
            last_save, last_ckpt_step, requests_["checkpoint"] = time.monotonic(), step, False
            if stop:
                return 0
    record = save(directory, checkpoint_payload(model, optimizer, step), "final", time.monotonic())
    write_status({"step": step, "loss": loss.item(), "last_checkpoint_step": step, "artifact_uri": record["uri"], "artifact_digest": record["manifest_digest"]})
    print(f"done at step {step}, final loss {loss.item():.6f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
