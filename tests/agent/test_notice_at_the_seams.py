"""A notice as the agent delivers it, to the process tree a real script has.

Each case runs a script under the real agent against the real control plane, with
DataLoader worker processes (plain or persistent), under `torchrun` with two ranks,
for the README's loop, Hugging Face's Trainer and Lightning: the cloud's metadata
service announces a preemption, and the notice save must commit (no worker killed
before it), the instance end `preempted` with its checkpoint saved, every process of
the tree be gone, no directory be left torn, and the run resumed from the notice
checkpoint end bitwise equal to an uninterrupted one. The agent used to signal the
trainer's whole process group; every one of these lost the save then (issue 32).
`bench/conformance.py` runs the whole matrix and prints it as a table.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from agents.agent.supervisor import descendants
from agents.checkpoint import layout
from agents.metadata_server import MetadataServer
from jobs.core.choices import EndReason, InstanceState
from jobs.models import Checkpoint, Instance, InterruptionEvent
from tests.agent.live import AgentProcess, alive, make_running_job
from tests.conftest import wait_until
from tests.integrations.trials import ROOT, differing, final_state

pytestmark = pytest.mark.e2e

STEPS = 240


@dataclass(frozen=True)
class Script:
    """A training command, and how to read the weights a finished run ends with."""

    module: str
    args: tuple[str, ...] = ()
    ranks: int = 1

    def argv(self, *extra: str) -> list[str]:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(self.ranks), "-m"] \
            if self.ranks > 1 else [sys.executable, "-m"]
        return [*launcher, self.module, "--steps", str(STEPS), *self.args, *extra]

    @property
    def writes_weights(self) -> bool:
        return self.module == LOOP

    def finished_weights(self, uri: Path) -> dict:
        if self.writes_weights:
            return torch.load(uri.parent / f"{uri.name}-weights.pt")
        return final_state(uri, STEPS)["model"]

    def extra(self, uri: Path) -> tuple[str, ...]:
        if not self.writes_weights:
            return ("--every-steps", "40")
        return ("--every-steps", "40", "--order", str(uri.parent / f"{uri.name}-order.txt"),
                "--weights", str(uri.parent / f"{uri.name}-weights.pt"))


LOOP = "agents.examples.loader_workers"
SCRIPTS = {
    "loop-workers": Script(LOOP, ("--workers", "2")),
    "loop-persistent-workers": Script(LOOP, ("--workers", "2", "--persistent-workers")),
    "loop-torchrun-2-ranks-workers": Script(LOOP, ("--workers", "2"), ranks=2),
    "hf-trainer-workers": Script("agents.examples.hf_trainer", ("--workers", "2")),
    "lightning-persistent-workers": Script("agents.examples.lightning_module", ("--workers", "2", "--persistent-workers")),
}


def standalone(script: Script, uri: Path) -> None:
    """A run to the end outside the agent (resuming from `uri`'s newest checkpoint)."""
    code, out = run_argv(script.argv("--uri", str(uri), *script.extra(uri)))
    assert code == 0, out[-3000:]


def run_argv(argv: list[str]) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPAWN_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Each script's weights after an uninterrupted run, made once."""
    made: dict[str, dict] = {}

    def weights(name: str) -> dict:
        if name not in made:
            uri = tmp_path_factory.mktemp("uninterrupted") / "ckpt"
            standalone(SCRIPTS[name], uri)
            made[name] = SCRIPTS[name].finished_weights(uri)
        return made[name]

    return weights


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_notice_through_the_agent_commits_stops_cleanly_and_resumes_bitwise(name, uninterrupted, team_setup, child_env,
                                                                             web_server, tmp_path):
    script = SCRIPTS[name]
    imds = MetadataServer("aws").start()
    job, setup = make_running_job(team_setup, tmp_path, steps=STEPS)  # checkpoints under tmp_path / "ckpt"
    uri = tmp_path / "ckpt" / f"job-{job.pk}"  # where the agent tells the trainer to write them
    uri.parent.mkdir()
    job.command = script.argv(*script.extra(uri), "--step-delay", "0.1")
    job.working_dir = str(ROOT)
    job.save(update_fields=["command", "working_dir"])
    agent = AgentProcess(child_env, tmp_path, url=web_server.url, bootstrap_token=setup.bootstrap_token,
                         provider="aws", metadata_url=imds.url).start()
    instance = setup.instance
    try:
        wait_until(lambda: Instance.objects.get(pk=instance.pk).last_step >= 30, timeout=120,
                   what="training progress in heartbeats", proc=agent)
        # Between epochs a loader without persistent workers has none for a moment.
        tree: list[int] = []

        def tree_with_workers() -> bool:
            tree[:] = descendants(agent.proc.pid)
            return len(tree) >= 3 * script.ranks

        wait_until(tree_with_workers, timeout=30, what="the trainer's loader workers", proc=agent)
        imds.schedule_notice(deadline_in_s=30)
        wait_until(lambda: Instance.objects.get(pk=instance.pk).state == InstanceState.ENDED, timeout=90,
                   what="instance ended", proc=None)
        agent.proc.wait(30)
    finally:
        agent.stop(9)
        imds.stop()
    output = agent.output()
    instance.refresh_from_db()
    assert instance.end_reason == EndReason.PREEMPTED, output[-4000:]
    assert "killed by signal" not in output, output[-4000:]
    event = InterruptionEvent.objects.get(instance=instance)
    notice = Checkpoint.objects.filter(instance=instance, kind="notice").first()
    assert notice is not None, output[-4000:]
    assert event.checkpoint_saved is True and notice.committed_at <= event.deadline, output[-4000:]
    assert notice.step >= 30
    assert not [pid for pid in tree if alive(pid)], "every process of the trainer's tree has ended"
    assert all((d / layout.MANIFEST).exists() for d in uri.iterdir() if layout.parse_step_dir(d.name) is not None)
    assert agent.proc.returncode == 0, output[-4000:]

    standalone(script, uri)  # resumes from the notice checkpoint
    assert differing(script.finished_weights(uri), uninterrupted(name)) == []


def test_a_finished_gang_under_torchrun_exits_0_however_the_script_tears_its_group_down(tmp_path):
    """No rank aborts on its way out: the checkpointer's coordination thread sat in a
    collective on its own gloo group while the script destroyed every group, and the
    rank died of "terminate called without an active exception" after its final commit
    (4 of 6 runs here), so torchrun failed a finished job."""
    script = Path(__file__).parent / "scripts" / "gang_bare_teardown.py"
    for trial in range(3):
        code, out = run_argv([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script),
                              "--uri", str(tmp_path / f"trial-{trial}")])
        assert code == 0 and "terminate called" not in out, f"trial {trial}: {out[-3000:]}"
