"""A local "VM" (DESIGN §10): a detached supervisor process in a session of its
own that serves the VM's metadata endpoint and runs the agent, and that the local
provider finds again through files in the VM's directory.

    python -m respawn_server.jobs.fleet.providers.local_vm VM_DIR

VM_DIR must hold `vm.json` (written by the provider: see VmSpec). The command
forks the supervisor, records its pid and start time in `pid.json` and returns at
once; the supervisor lives on in its own session, so the process that launched it
(e.g. a Celery worker) can die without taking the VM along. The supervisor:

- writes the bootstrap token to a 0600 file (what a cloud's user data does),
  the VM user's when the spec names one (`run_as`),
- serves an IMDS-compatible endpoint (respawn.metadata_server, AWS flavour; its
  instance id is the VM's id) on a free port of 127.0.0.1,
- runs `respawn-agent run ... --provider local --metadata-url URL` as its child
  (which dies with it: PR_SET_PDEATHSIG), with the spec's environment only, as the
  spec's user and group when it names them (the supervisor itself stays root, so
  the VM can neither signal it nor change the files the provider reads),
- at the preemption time chosen by the market, or at once when a drill asks for it
  (`interrupt.json`: with a notice, or a hard reclaim with none): serves the notice, sends SIGTERM to
  the agent `sigterm_after_notice_s` later (a cloud's ACPI shutdown), and at the
  deadline kills every process of the VM,
- on SIGTERM (the provider's terminate): SIGTERM to the agent, SIGKILL to the rest
  after `terminate_grace_s`,
- when the agent exits on its own, shuts the VM down.
It is a child subreaper, so whatever the agent or the trainer starts and orphans
still counts as the VM's and is killed with it. Its end is written to `ended.json`.

Files in VM_DIR: vm.json (spec, 0600: it carries the bootstrap token, like user
data), pid.json, terminate.json (a terminate was requested), interrupt.json (a drill), ended.json,
metadata-url, bootstrap-token, supervisor.log, agent.log, work/ (the agent's, and
the VM's HOME; 0700).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from respawn.agent.supervisor import die_with_parent
from respawn.metadata_server import MetadataServer

log = logging.getLogger("respawn.local_vm")

PR_SET_CHILD_SUBREAPER = 36
TICK_S = 0.05
KILL_TIMEOUT_S = 10.0  # give up killing (and say so) after this long: a process stuck in the kernel


# --- the VM's files -----------------------------------------------------------------
@dataclass(kw_only=True)
class VmSpec:
    """Everything the supervisor needs, written by the provider before it starts."""

    vm_id: str
    job_id: int
    instance_id: int
    zone: str
    instance_type: str
    market: str
    launched_at: float  # epoch seconds
    control_plane_url: str
    bootstrap_token: str
    agent_command: list[str]
    """The agent's program, e.g. [python, "-m", "respawn.agent"]; `run` and its flags are appended."""
    agent_env: dict[str, str] = field(default_factory=dict)
    """The agent's whole environment."""
    run_as: list[int] | None = None
    """[uid, gid] the agent runs as; None: the supervisor's own user."""
    preempt_after_s: float | None = None
    """Seconds from boot to the preemption notice; None: never preempted."""
    notice_lead_s: float = 30.0
    sigterm_after_notice_s: float = 15.0
    terminate_grace_s: float = 5.0
    boot_delay_s: float = 0.0
    """Seconds before the agent starts (a cloud VM's boot); a terminate meanwhile ends the VM."""


def write_json_atomic(path: Path, obj: dict, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except json.JSONDecodeError:
        return None  # only ever written atomically: unreadable means not ours to trust


class VmDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.spec_file = self.path / "vm.json"
        self.pid_file = self.path / "pid.json"
        self.terminate_file = self.path / "terminate.json"
        self.interrupt_file = self.path / "interrupt.json"
        self.ended_file = self.path / "ended.json"
        self.metadata_url_file = self.path / "metadata-url"
        self.token_file = self.path / "bootstrap-token"
        self.supervisor_log = self.path / "supervisor.log"
        self.agent_log = self.path / "agent.log"
        self.work_dir = self.path / "work"

    def read_spec(self) -> VmSpec:
        raw = read_json(self.spec_file)
        if raw is None:
            raise ValueError(f"{self.spec_file} is missing or not JSON")
        try:
            return VmSpec(**raw)
        except TypeError as exc:
            raise ValueError(f"{self.spec_file} is not a VM spec: {exc}") from None

    def write_spec(self, spec: VmSpec) -> None:
        write_json_atomic(self.spec_file, asdict(spec), mode=0o600)

    def pid_record(self) -> dict | None:
        return read_json(self.pid_file)

    def record_pid(self, pid: int) -> None:
        write_json_atomic(self.pid_file, {"pid": pid, "start_time": process_start_time(pid)})

    def ended(self) -> dict | None:
        return read_json(self.ended_file)

    def record_end(self, reason: str, **details) -> None:
        write_json_atomic(self.ended_file, {"reason": reason, "ended_at": time.time(), **details})

    def terminate_requested(self) -> dict | None:
        return read_json(self.terminate_file)

    def interrupt_requested(self) -> dict | None:
        """A drill's request (LocalProvider.interrupt): {"with_notice": bool, "requested_at": epoch s}."""
        return read_json(self.interrupt_file)


# --- processes ---------------------------------------------------------------------
@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    ppid: int
    session: int
    start_time: int  # clock ticks since boot: with the pid, names one process for good


def proc_stat(pid: int) -> ProcStat | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name is in parentheses and may hold spaces or ')': split after the last one.
    fields = raw.rsplit(")", 1)[1].split()
    return ProcStat(pid=pid, state=fields[0], ppid=int(fields[1]), session=int(fields[3]), start_time=int(fields[19]))


def process_start_time(pid: int) -> int | None:
    stat = proc_stat(pid)
    return stat.start_time if stat else None


def is_running(pid: int, start_time: int | None) -> bool:
    """Whether the process `pid` started at `start_time` still runs (a recycled pid does not count)."""
    stat = proc_stat(pid)
    return stat is not None and stat.state not in ("Z", "X") and stat.start_time == start_time


def all_processes() -> list[ProcStat]:
    stats = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = proc_stat(int(entry))
            if stat is not None and stat.state not in ("Z", "X"):
                stats.append(stat)
    return stats


def vm_processes(supervisor_pid: int, start_time: int | None) -> set[int]:
    """Every live process of the VM whose supervisor is (`supervisor_pid`, `start_time`):
    the members of its session and, while the supervisor runs, it and all its
    descendants (the trainer runs in a session of its own). A pid still in use as a
    session id is never given to another process, so the session's members are the
    VM's even after its supervisor died; its descendants are only trusted while the
    supervisor is the process recorded."""
    leader = proc_stat(supervisor_pid)
    if leader is not None and leader.start_time != start_time:
        return set()  # the pid was given to another process: the VM's session had already ended
    stats = all_processes()
    found = {stat.pid for stat in stats if stat.session == supervisor_pid}
    if not is_running(supervisor_pid, start_time):
        return found
    children: dict[int, list[int]] = {}
    for stat in stats:
        children.setdefault(stat.ppid, []).append(stat.pid)
    found.add(supervisor_pid)
    stack = list(found)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def kill_vm_processes(supervisor_pid: int, start_time: int | None, *, spare: int | None = None) -> set[int]:
    """SIGKILL every process of the VM (but `spare`) until none is left; returns those
    still alive after KILL_TIMEOUT_S (normally none)."""
    give_up = time.monotonic() + KILL_TIMEOUT_S
    while True:
        reap_children()
        victims = vm_processes(supervisor_pid, start_time) - {spare}
        if not victims or time.monotonic() > give_up:
            return victims
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


def reap_children() -> dict[int, int]:
    """Collect exited children (ours and orphans handed to us as subreaper): pid -> exit code."""
    reaped = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped[pid] = os.waitstatus_to_exitcode(status)


# --- the supervisor ------------------------------------------------------------------
def as_vm_user(run_as: list[int] | None, parent_pid: int):
    """The agent's preexec: become the VM's user and group (no supplementary groups,
    a umask that shares files with the job's group and no one else), then die with
    the supervisor. In that order: a change of credentials clears PR_SET_PDEATHSIG."""
    die = die_with_parent(parent_pid)

    def preexec() -> None:
        if run_as:
            uid, gid = run_as
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            os.umask(0o007)
        die()

    return preexec


class Supervisor:
    def __init__(self, vm: VmDir, spec: VmSpec):
        self.vm, self.spec = vm, spec
        self.shutdown = threading.Event()  # set by SIGTERM: the provider terminates the VM
        self.agent_pid: int | None = None
        self.agent_exit: int | None = None

    def run(self) -> None:
        signal.signal(signal.SIGTERM, lambda signum, frame: self.shutdown.set())
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            log.warning("could not become a child subreaper (errno %d): orphans of the agent would escape the VM", ctypes.get_errno())
        if self.vm.terminate_requested():
            self.vm.record_end("terminated", detail="terminated before boot")
            return
        metadata = MetadataServer("aws")
        metadata.state.instance_id = self.spec.vm_id
        metadata.start()
        try:
            self.vm.metadata_url_file.write_text(metadata.url)
            reason = self._run_agent(metadata)
        finally:
            left = kill_vm_processes(os.getpid(), process_start_time(os.getpid()), spare=os.getpid())
            metadata.stop()
        if left:
            log.error("processes %s of VM %s survived SIGKILL for %.0fs", sorted(left), self.spec.vm_id, KILL_TIMEOUT_S)
        self.vm.record_end(reason, agent_exit_code=self.agent_exit)
        log.info("VM %s is gone: %s (agent exit code %s)", self.spec.vm_id, reason, self.agent_exit)

    def _run_agent(self, metadata: MetadataServer) -> str:
        spec = self.spec
        if self.shutdown.wait(spec.boot_delay_s):
            return "terminated"
        fd = os.open(self.vm.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            if spec.run_as:
                os.fchown(f.fileno(), *spec.run_as)
            f.write(spec.bootstrap_token)
        argv = [
            *spec.agent_command, "run",
            "--control-plane-url", spec.control_plane_url,
            "--bootstrap-token-file", str(self.vm.token_file),
            "--provider", "local",
            "--work-dir", str(self.vm.work_dir),
            "--metadata-url", metadata.url,
        ]
        with open(self.vm.agent_log, "ab") as out:
            try:
                proc = subprocess.Popen(
                    argv, env=spec.agent_env, stdin=subprocess.DEVNULL,
                    stdout=out, stderr=subprocess.STDOUT, preexec_fn=as_vm_user(spec.run_as, os.getpid()),
                )
            except OSError as exc:
                log.error("VM %s: could not start the agent %s: %s", spec.vm_id, argv[:3], exc)
                return "agent failed to start"
        self.agent_pid = proc.pid
        log.info("VM %s booted: metadata %s, agent pid %d, preemption %s", spec.vm_id, metadata.url, proc.pid,
                 "never" if spec.preempt_after_s is None else f"in {spec.preempt_after_s:.1f}s")
        boot = time.monotonic()
        notice_at = None if spec.preempt_after_s is None else boot + spec.preempt_after_s
        sigterm_at = deadline = None
        while True:
            # Reaping here (not Popen.poll) also collects orphans handed to us as subreaper.
            reaped = reap_children()
            if self.agent_pid in reaped:
                self.agent_exit = reaped[self.agent_pid]
                return "preempted" if deadline is not None else "agent exited"
            now = time.monotonic()
            if self.shutdown.is_set():
                self._signal_agent(signal.SIGTERM)
                self._wait_agent(spec.terminate_grace_s)
                return "terminated"
            if deadline is None and self.vm.interrupt_requested() is not None:
                # A drill: the market's notice now, or with no notice a hard reclaim (the
                # caller's `finally` kills the whole VM at once, as a cloud's reclaim would).
                if not self.vm.interrupt_requested().get("with_notice", True):
                    log.info("VM %s: reclaimed without notice (a drill)", spec.vm_id)
                    return "preempted"
                notice_at = now
            if notice_at is not None and deadline is None and now >= notice_at:
                metadata.schedule_notice(in_s=0.0, deadline_in_s=spec.notice_lead_s)
                sigterm_at, deadline = now + spec.sigterm_after_notice_s, now + spec.notice_lead_s
                log.info("VM %s: preemption notice served; SIGTERM in %.1fs, gone in %.1fs", spec.vm_id, spec.sigterm_after_notice_s, spec.notice_lead_s)
            if sigterm_at is not None and now >= sigterm_at:
                self._signal_agent(signal.SIGTERM)
                sigterm_at = None
            if deadline is not None and now >= deadline:
                return "preempted"
            self.shutdown.wait(TICK_S)

    def _signal_agent(self, signum: int) -> None:
        try:
            os.kill(self.agent_pid, signum)
        except ProcessLookupError:
            pass

    def _wait_agent(self, timeout_s: float) -> None:
        give_up = time.monotonic() + timeout_s
        while time.monotonic() < give_up:
            reaped = reap_children()
            if self.agent_pid in reaped:
                self.agent_exit = reaped[self.agent_pid]
                return
            time.sleep(TICK_S)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m respawn_server.jobs.fleet.providers.local_vm", description="Boot a local VM from VM_DIR/vm.json, detached.")
    parser.add_argument("vm_dir")
    args = parser.parse_args(argv)
    os.umask(0o077)  # the supervisor's files (pid, metadata URL, its end) are no VM's business
    vm = VmDir(args.vm_dir)
    try:
        spec = vm.read_spec()
    except ValueError as exc:
        print(f"local_vm: {exc}", file=sys.stderr)
        return 2
    # Fork before any thread exists; the child makes a session of its own and the
    # parent returns as soon as the child's identity is on disk.
    child = os.fork()
    if child:
        vm.record_pid(child)
        return 0
    os.setsid()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    code = 0
    try:
        Supervisor(vm, spec).run()
    except BaseException:
        log.exception("the supervisor of VM %s failed", spec.vm_id)
        code = 1
    logging.shutdown()
    os._exit(code)  # the forked child never returns into the caller's code


if __name__ == "__main__":
    sys.exit(main())
