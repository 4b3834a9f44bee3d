"""The agent's signals, as it delivers them, to the process tree a real script has.

Each case runs a script under the real agent against the real control plane: the
README's loop with DataLoader worker processes (plain, persistent, under `torchrun`
with two ranks), Hugging Face's Trainer, Lightning, Accelerate and Flax/Orbax. Then:

- notice: the cloud's metadata service announces a preemption; the notice save of the
  next step commits (no loader worker killed before it), the instance ends `preempted`
  with its checkpoint saved, every process of the tree is gone;
- checkpoint-now: the control plane asks for a save (SIGUSR1); it commits and training
  goes on with its workers, then a notice ends the run as above;
- kill mid-save: the VM dies (SIGKILL to the agent) while a checkpoint is being
  written; nothing of the tree survives it and the torn directory is never loaded;
- deadline passes: a notice whose deadline leaves no time to save; the run is killed
  in time, nothing hangs, the notice is recorded missed with the steps it cost;

and in every case no directory is left torn but the killed one, and the run resumed
from the newest committed checkpoint ends bitwise equal to an uninterrupted one. The
agent used to signal the trainer's whole process group: every notice case lost its save.

A fast subset runs in the suite; `bench/conformance.py` runs every cell
(RESPAWN_CONFORMANCE=all) and prints the table from RESPAWN_CONFORMANCE_RESULTS.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from respawn.agent.supervisor import descendants
from respawn.checkpoint import layout
from respawn.metadata_server import MetadataServer
from respawn.protocol import Action
from respawn_server.jobs.core.choices import EndReason, InstanceState
from respawn_server.jobs.models import Checkpoint, Instance, InterruptionEvent
from tests.agent.live import AgentProcess, alive, make_running_job
from tests.conftest import wait_until
from tests.integrations.trials import ROOT, differing, final_state, standalone_env

pytestmark = [pytest.mark.e2e, pytest.mark.store_incidental]

STEPS = 240
LONG_STEP_S = 6.0  # the deadline-passes cell's steps: longer than its notice's whole window
LOOP = "respawn.examples.loader_workers"


@dataclass(frozen=True)
class Script:
    """A training command, and how to read the weights a finished run ends with."""

    module: str
    args: tuple[str, ...] = ()
    ranks: int = 1
    needs: str = "torch"

    def argv(self, *extra: str) -> list[str]:
        # --standalone: a free port of its own, not 29500 (another run may hold it)
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(self.ranks), "-m"] \
            if self.ranks > 1 else [sys.executable, "-m"]
        return [*launcher, self.module, "--steps", str(STEPS), *self.args, *extra]

    @property
    def workers(self) -> int:
        return int(self.args[self.args.index("--workers") + 1]) if "--workers" in self.args else 0

    def outputs(self, uri: Path) -> tuple[str, ...]:
        if self.module != LOOP:
            return ("--every-steps", "40")
        return ("--every-steps", "40", "--order", str(uri.parent / f"{uri.name}-order.txt"),
                "--weights", str(self.weights_file(uri)))

    def weights_file(self, uri: Path) -> Path:
        return uri.parent / f"{uri.name}-weights.pt"

    def finished_weights(self, uri: Path) -> dict:
        if self.module == LOOP:
            return torch.load(self.weights_file(uri))
        if self.needs == "orbax.checkpoint":
            import jax

            from tests.integrations.test_jax import _raw, saved

            leaves = jax.tree.flatten_with_path(jax.tree.map(_raw, saved(uri, STEPS)[0]))[0]
            return {jax.tree_util.keystr(path): torch.from_numpy(leaf.copy()) for path, leaf in leaves}
        if self.needs == "accelerate":  # save_state's files, written deterministically: their digests
            files = json.loads((uri / layout.step_dir(STEPS) / layout.MANIFEST).read_text())["files"]
            return {name: entry["digest"] for name, entry in files.items() if name.endswith((".safetensors", ".bin"))}
        return final_state(uri, STEPS)["model"]


def scripts() -> dict[str, Script]:
    cases = {}
    for workers, tag in ((("--workers", "0"), "no-workers"), (("--workers", "2"), "workers"),
                         (("--workers", "2", "--persistent-workers"), "persistent-workers")):
        cases[f"loop-{tag}"] = Script(LOOP, workers)
        cases[f"loop-torchrun-2-ranks-{tag}"] = Script(LOOP, workers, ranks=2)
        cases[f"hf-{tag}"] = Script("respawn.examples.hf_trainer", workers, needs="transformers")
        cases[f"lightning-{tag}"] = Script("respawn.examples.lightning_module", workers, needs="lightning")
        cases[f"accelerate-{tag}"] = Script("respawn.examples.accelerate_loop", workers, needs="accelerate")
    cases["jax-orbax"] = Script("respawn.examples.jax_flax", needs="orbax.checkpoint")
    return cases


SCRIPTS = scripts()
EVENTS = ("notice", "checkpoint-now", "kill-mid-save", "deadline-passes")
# The suite's subset: each kind of process tree under a notice, each other event once
# (checkpoint-now ends in a notice, so it is the loop with workers' notice cell too).
FAST = [("loop-persistent-workers", "notice"), ("loop-torchrun-2-ranks-workers", "notice"),
        ("hf-persistent-workers", "notice"), ("lightning-persistent-workers", "notice"), ("loop-workers", "checkpoint-now"),
        ("loop-workers", "kill-mid-save"), ("loop-workers", "deadline-passes")]
CELLS = [(s, e) for s in SCRIPTS for e in EVENTS] if os.environ.get("RESPAWN_CONFORMANCE") == "all" else FAST


def run_argv(argv: list[str]) -> tuple[int, str]:
    done = subprocess.run(argv, cwd=ROOT, env=standalone_env(), capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr


def run_to_the_end(script: Script, uri: Path) -> None:
    """A run to the end outside the agent, resuming from `uri`'s newest checkpoint."""
    code, out = run_argv(script.argv("--uri", str(uri), *script.outputs(uri)))
    assert code == 0, out[-3000:]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Each script's weights after an uninterrupted run, made once."""
    made: dict[str, object] = {}

    def weights(name: str):
        if name not in made:
            uri = tmp_path_factory.mktemp("uninterrupted") / "ckpt"
            run_to_the_end(SCRIPTS[name], uri)
            made[name] = SCRIPTS[name].finished_weights(uri)
        return made[name]

    return weights


def torn_steps(uri: Path) -> list[int]:
    if not uri.exists():
        return []
    return sorted(step for d in uri.iterdir() if (step := layout.parse_step_dir(d.name)) is not None
                  and not (d / layout.MANIFEST).exists())


def committed_checkpoints(instance: Instance, kind: str | None = None):
    rows = Checkpoint.objects.filter(instance=instance)
    return rows.filter(kind=kind) if kind else rows


class Trial:
    """One cell: the job, its VM (agent + metadata emulator), and what the test saw."""

    def __init__(self, script: Script, team_setup, child_env, web_server, tmp_path, step_delay_s: float = 0.1):
        self.script = script
        self.imds = MetadataServer("aws").start()
        job, setup = make_running_job(team_setup, tmp_path, steps=STEPS)
        self.uri = tmp_path / "ckpt" / f"job-{job.pk}"  # where the agent tells the trainer to write
        self.uri.parent.mkdir()
        job.command = script.argv(*script.outputs(self.uri), "--step-delay", str(step_delay_s))
        job.working_dir = str(ROOT)
        job.save(update_fields=["command", "working_dir"])
        self.job, self.instance = job, setup.instance
        self.agent = AgentProcess(child_env, tmp_path, url=web_server.url, bootstrap_token=setup.bootstrap_token,
                                  provider="aws", metadata_url=self.imds.url).start()
        self.tree: list[int] = []
        self.notice_committed_at: float | None = None
        self.exited_at: float | None = None

    def row(self) -> Instance:
        return Instance.objects.get(pk=self.instance.pk)

    def wait_for_training(self, steps: int = 30) -> None:
        wait_until(lambda: self.row().last_step >= steps, timeout=180, what="training progress in heartbeats", proc=self.agent)

        # Between epochs a loader without persistent workers has none for a moment.
        def tree_with_workers() -> bool:
            self.tree = descendants(self.agent.proc.pid)
            return len(self.tree) >= self.script.ranks * (1 + min(self.script.workers, 1))

        wait_until(tree_with_workers, timeout=30, what="the trainer's processes", proc=self.agent)

    def notice(self, deadline_in_s: float = 30) -> None:
        self.imds.schedule_notice(deadline_in_s=deadline_in_s)
        while self.agent.proc.poll() is None:
            if self.notice_committed_at is None and committed_checkpoints(self.instance, "notice").exists():
                self.notice_committed_at = time.monotonic()
            if self.exited_at is None and not any(alive(pid) for pid in self.tree):
                self.exited_at = time.monotonic()
            time.sleep(0.02)
        wait_until(lambda: self.row().state == InstanceState.ENDED, timeout=60, what="instance ended", proc=None)

    def notice_past_the_next_step(self) -> None:
        """A notice whose deadline comes before the next step boundary (steps of
        LONG_STEP_S, the notice right after one): no save can meet it."""
        status = self.agent.work_dir / "channel" / "status.json"
        seen = status.stat().st_mtime_ns
        wait_until(lambda: status.stat().st_mtime_ns != seen, timeout=3 * LONG_STEP_S, what="a step boundary",
                   proc=self.agent, interval=0.005)
        # AWS states whole seconds, so the window is 4-5 s: a loaded machine's agent may
        # first see the notice seconds late, and one seen after its time is acted on
        # with the default budget (the VM may well still live), which is not this cell
        self.notice(deadline_in_s=5)

    def checkpoint_now(self) -> int:
        before = committed_checkpoints(self.instance).count()
        Instance.objects.filter(pk=self.instance.pk).update(requested_action=Action.CHECKPOINT)
        wait_until(lambda: committed_checkpoints(self.instance).count() > before, timeout=60,
                   what="the checkpoint asked for", proc=self.agent)
        return committed_checkpoints(self.instance).order_by("-step").first().step

    def kill_mid_save(self) -> int | None:
        """SIGKILL the VM (its agent: the trainer dies with it) while a checkpoint is written."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (torn := torn_steps(self.uri)):
            time.sleep(0.001)
        self.agent.proc.send_signal(signal.SIGKILL)
        self.agent.proc.wait(30)
        wait_until(lambda: not any(alive(pid) for pid in self.tree), timeout=10, what="the tree dying with its VM")
        return torn[0] if torn else None

    def stop(self) -> None:
        self.agent.stop(9)
        self.imds.stop()


def record(cell: str, **figures) -> None:
    """One row of bench/conformance.py's table."""
    path = os.environ.get("RESPAWN_CONFORMANCE_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"cell": cell, **figures}) + "\n")


@pytest.mark.parametrize("name,event", CELLS, ids=[f"{s}-{e}" for s, e in CELLS])
def test_the_agents_signals_reach_the_trainer_not_its_helpers(name, event, uninterrupted, team_setup, child_env,
                                                              web_server, tmp_path):
    script = SCRIPTS[name]
    pytest.importorskip(script.needs)
    trial = Trial(script, team_setup, child_env, web_server, tmp_path,
                  step_delay_s=LONG_STEP_S if event == "deadline-passes" else 0.1)
    figures: dict = {}
    try:
        trial.wait_for_training(2 if event == "deadline-passes" else 30)
        if event == "checkpoint-now":
            figures["asked_step"] = trial.checkpoint_now()
            trial.wait_for_training()  # goes on, its workers with it
            assert trial.agent.proc.poll() is None and all(alive(pid) for pid in trial.tree[:1])
        if event == "kill-mid-save":
            figures["torn_step"] = trial.kill_mid_save()
        elif event == "deadline-passes":
            trial.notice_past_the_next_step()
        else:
            trial.notice()
    finally:
        trial.stop()
    output = trial.agent.output()
    assert "killed by signal" not in output, output[-4000:]
    assert not [pid for pid in trial.tree if alive(pid)], "every process of the trainer's tree has ended"
    instance = trial.row()
    if event in ("notice", "checkpoint-now"):
        assert instance.end_reason == EndReason.PREEMPTED, output[-4000:]
        event_row = InterruptionEvent.objects.get(instance=instance)
        notice = committed_checkpoints(instance, "notice").first()
        assert notice is not None and event_row.checkpoint_saved is True, output[-4000:]
        assert notice.committed_at <= event_row.deadline and notice.step >= 30
        assert trial.agent.proc.returncode == 0, output[-4000:]
        assert torn_steps(trial.uri) == []
        figures["notice_step"] = notice.step
        if trial.exited_at and trial.notice_committed_at:
            figures["commit_to_exit_s"] = round(max(0.0, trial.exited_at - trial.notice_committed_at), 2)
    elif event == "deadline-passes":
        event_row = InterruptionEvent.objects.get(instance=instance)
        assert event_row.checkpoint_saved is False and event_row.steps_lost is not None, output[-4000:]
        assert trial.job.events.filter(message__startswith="notice missed").exists()
        figures["steps_lost"] = event_row.steps_lost
    else:
        assert len(torn_steps(trial.uri)) <= 1  # the one being written, never loaded

    run_to_the_end(script, trial.uri)  # resumes from the newest committed checkpoint
    assert differing(script.finished_weights(trial.uri), uninterrupted(name)) == []
    record(f"{name} / {event}", passed=True, **figures)


def test_a_finished_gang_under_torchrun_exits_0_however_the_script_tears_its_group_down(tmp_path):
    """No rank aborts on its way out: the checkpointer's coordination thread sat in a
    collective on its own gloo group while the script destroyed every group, and the
    rank died of "terminate called without an active exception" after its final commit
    (4 of 6 runs here), so torchrun failed a finished job."""
    script = Path(__file__).parent / "scripts" / "gang_bare_teardown.py"
    for trial in range(3):
        code, out = run_argv([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
                              "--uri", str(tmp_path / f"trial-{trial}")])
        assert code == 0 and "terminate called" not in out, f"trial {trial}: {out[-3000:]}"
