"""`make demo` as a newcomer runs it: `manage.py demo` on the embedded default (in a
temporary var dir, on a free port) until its demo job's local VM trains, then
Ctrl-C as a terminal sends it, to the command's whole foreground process group.

The terminal shows a short welcome, printed once the server answers and ending with
the job's link; the logs and the token stay where they belong. After Ctrl-C nothing
of the demo is left: no process of its tree, no local VM, no listener on its port,
and the VM it terminated ended `cancelled`, not lost or preempted later."""

import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from respawn_server.jobs.fleet.providers.local_vm import ProcStat, VmDir, all_processes, is_running, vm_processes
from tests.conftest import ROOT, free_port, searchable_by_vms

SERVER_ENV = ("DATABASE_URL", "CELERY_", "DJANGO_", "RESPAWN_")  # the README's default has none of them


@dataclass
class DemoRun:
    var: Path
    port: int
    terminal: str
    """What the terminal showed before Ctrl-C."""
    answered_when_up: bool
    """Whether the server answered the moment "Respawn is up" was printed."""
    stopped_output: str
    exit_code: int
    processes: list[ProcStat]
    """Every process of the demo's tree and of its local VM, just before Ctrl-C."""


def wait_for(predicate, what: str, demo: subprocess.Popen, output: Path, timeout: float = 240.0):
    give_up = time.monotonic() + timeout
    while not predicate():
        assert demo.poll() is None, f"demo exited with {demo.returncode} waiting for {what}:\n{output.read_text()}"
        assert time.monotonic() < give_up, f"timed out waiting for {what}:\n{output.read_text()}"
        time.sleep(0.05)


def descendants(root: int) -> list[ProcStat]:
    stats = all_processes()
    found, frontier = [], {root}
    while frontier:
        children = [s for s in stats if s.ppid in frontier]
        found += children
        frontier = {s.pid for s in children}
    return found


def vm_dirs(var: Path) -> list[VmDir]:
    return [VmDir(d) for d in (var / "local-vms").glob("local-*")]


def port_is_free(port: int) -> bool:
    """Whether a server could listen on `port` again (as servers do, despite connections
    of the last one still in TIME_WAIT)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> DemoRun:
    var = tmp_path_factory.mktemp("demo") / "var"
    searchable_by_vms(var.parent)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(SERVER_ENV)} | {"RESPAWN_VAR_DIR": str(var)}
    output = var.parent / "terminal.txt"
    with open(output, "wb") as out:
        # A session of its own, as a terminal gives its foreground job: Ctrl-C reaches its whole group.
        demo = subprocess.Popen([sys.executable, "manage.py", "demo", "--port", str(port)], cwd=ROOT, env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: "Respawn is up" in output.read_text(), "the welcome", demo, output)
        try:
            answered_when_up = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).ok
        except requests.RequestException:
            answered_when_up = False
        wait_for(lambda: any(vm.agent_log.exists() and "trainer started" in vm.agent_log.read_text()
                             for vm in vm_dirs(var)), "the demo job's trainer on a local VM", demo, output)
        terminal = output.read_text()
        processes = descendants(demo.pid)
        for vm in vm_dirs(var):
            record = vm.pid_record()
            processes += [s for s in all_processes() if s.pid in vm_processes(record["pid"], record["start_time"])]
        os.killpg(demo.pid, signal.SIGINT)
        exit_code = demo.wait(timeout=120)
    finally:
        if demo.poll() is None:
            # A failed wait still ends the demo as Ctrl-C does, so it stops its web, worker, beat
            # and VMs (sessions of their own, which a SIGKILL of its group would leave running).
            os.killpg(demo.pid, signal.SIGINT)
            try:
                demo.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(demo.pid, signal.SIGKILL)
                demo.wait()
    return DemoRun(var=var, port=port, terminal=terminal, answered_when_up=answered_when_up,
                   stopped_output=output.read_text()[len(terminal):], exit_code=exit_code, processes=processes)


@pytest.mark.e2e
def test_ctrl_c_leaves_no_process_no_vm_and_no_listener_and_ends_the_vm_cancelled(demo_run):
    assert demo_run.exit_code == 0, demo_run.stopped_output
    assert "demo stopped: 1 local VM(s) terminated" in demo_run.stopped_output
    assert len(demo_run.processes) >= 7, "web (master, 2 workers), worker, beat, the VM's supervisor and agent"
    left = [s.pid for s in demo_run.processes if is_running(s.pid, s.start_time)]
    assert not left, f"still running after demo exited: {left}"
    assert port_is_free(demo_run.port)
    # The web server got one signal, from demo, not the terminal's SIGINT as well.
    web_log = demo_run.var / "logs" / "web.log"
    said = demo_run.stopped_output + (web_log.read_text() if web_log.exists() else "")
    assert re.findall(r"Handling signal: (\w+)", said) == ["term"], said
    with sqlite3.connect(demo_run.var / "respawn.sqlite3") as db:
        instances = db.execute("SELECT state, end_reason FROM jobs_instance").fetchall()
        interruptions = db.execute("SELECT count(*) FROM jobs_interruptionevent").fetchone()[0]
        preemptions = db.execute("SELECT preemptions FROM jobs_job").fetchall()
    assert instances == [("ended", "cancelled")] and interruptions == 0 and preemptions == [(0,)]


@pytest.mark.e2e
def test_the_terminal_shows_a_short_welcome_once_the_server_answers_with_the_job_link_last(demo_run):
    lines = demo_run.terminal.splitlines()
    assert demo_run.answered_when_up
    assert len(lines) <= 12, demo_run.terminal
    assert not [line for line in lines if "GET /" in line or "celery" in line.lower()], demo_run.terminal
    up = next(i for i, line in enumerate(lines) if "Respawn is up" in line)
    assert any("log in as demo / demo-password" in line for line in lines[up:])
    assert re.search(rf"demo job #1: http://127\.0\.0\.1:{demo_run.port}/jobs/1/$", lines[-2]), demo_run.terminal
    assert lines[-1] == "Ctrl-C stops web, worker, beat and every local VM."
    # The server's and the workers' logs are in var/logs, and the token in none of them.
    logs = demo_run.var / "logs"
    assert "GET /healthz" in (logs / "web-access.log").read_text()
    assert "respawn_server.jobs.tasks.schedule" in (logs / "worker.log").read_text()
    token = re.search(r"API token \(shown once\): (\S+)", demo_run.terminal).group(1)
    written = [p for p in demo_run.var.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert not written, f"the API token is written to {written}"
