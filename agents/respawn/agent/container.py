"""The trainer inside the job's container image (DESIGN §11: `container_image`), run
with podman, or docker where podman is missing.

What the trainer sees is what it would see on the VM: the same paths, bind-mounted
(its working directory, the agent's work directory with the channel files the
checkpoint library talks through: status, notice, control, checkpoints; a local
checkpoint prefix), the same environment (passed by name, `--env NAME`, so no value,
secret or not, is ever on a command line), the VM's network (a gang's rendezvous,
the metadata service, storage endpoints), and the VM's GPUs when it has any. The
checkpoint library is this agent's own `agents/` package, mounted read-only on
PYTHONPATH: the image brings Python and the training stack (torch), not Respawn.

Signals go through the runtime (`kill --signal`) to the container's init (`--init`),
which passes them to the trainer; `podman run` / `docker run` then exit with the
trainer's exit status. The client's own signal proxy is off (`--sig-proxy=false`): it
is set up only after the container has started, and a signal that reaches the client
before then is lost (Go ignores a SIGUSR1 it has no handler for; podman#8086,
podman#17489); one path, not two racing. A SIGKILL reaches only the client, so `kill`
also removes the container. Exit statuses 125-127, and the init's own word that it could not
exec the command, are the runtime's (no such image, a container that cannot
start, a command the image lacks): a setup failure, not the user's code."""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import respawn
from respawn.agent.supervisor import TrainerProcess

RUNTIMES = ("podman", "docker")
# Statuses `podman run` and `docker run` use for their own failures, not the command's:
# 125 the runtime (an image it cannot find, a container it cannot create or start),
# 126 a command that cannot be invoked, 127 a command the image does not have.
RUNTIME_FAILURES = {125: "the container could not be started", 126: "the command cannot be run in the image",
                    127: "the command was not found in the image"}
# What the container's init (podman's catatonit, docker's tini) says, exiting 1, when it
# cannot exec the command: the trainer never ran.
INIT_EXEC_FAILED = re.compile(r"catatonit:\d+\): failed to exec pid1|\[FATAL tini \(\d+\)\] exec .* failed")
# Where the agent's checkpoint library is mounted in the container.
LIB_MOUNT = "/opt/respawn/agent-lib"
# The VM's, not the image's: the image keeps its own PATH, HOME and Python.
HOST_ONLY_ENV = frozenset({"PATH", "HOME", "HOSTNAME", "PWD", "OLDPWD", "SHLVL", "TMPDIR", "USER", "LOGNAME",
                           "SHELL", "TERM", "_", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH", "LD_LIBRARY_PATH",
                           "LD_PRELOAD", "NOTIFY_SOCKET", "INVOCATION_ID", "JOURNAL_STREAM"})


class NoRuntime(FileNotFoundError):
    """Neither podman nor docker is on the VM's PATH."""


def find_runtime(path: str | None = None) -> str:
    for name in RUNTIMES:
        found = shutil.which(name, path=path)
        if found:
            return found
    raise NoRuntime("the job names a container_image, but neither podman nor docker is installed on the VM "
                    "(the machine image must bring one)")


def container_name(instance_id: int) -> str:
    return f"respawn-trainer-{instance_id}"


def gpu_args(runtime: str) -> list[str]:
    """The VM's GPUs, when it has any (NVIDIA's device nodes): podman names them by CDI,
    docker through the NVIDIA container toolkit's --gpus."""
    if not glob.glob("/dev/nvidia[0-9]*"):
        return []
    return ["--device", "nvidia.com/gpu=all"] if Path(runtime).name == "podman" else ["--gpus", "all"]


def local_dir(uri: str) -> str | None:
    """The directory of a local checkpoint prefix (a path or file://), None for object storage."""
    parts = urlsplit(uri)
    if parts.scheme == "file":
        return parts.path
    return uri if uri and not parts.scheme else None


def run_argv(*, runtime: str, image: str, name: str, command: list[str], env: dict[str, str], cwd: str | None,
             mounts: list[str]) -> list[str]:
    """The command line that runs `command` in `image`. `env` is the trainer's whole
    environment; its values reach the container from the runtime's own environment."""
    argv = [runtime, "run", "--rm", "--init", "--sig-proxy=false", "--name", name, "--network", "host",
            "--ipc", "host", *gpu_args(runtime)]
    for path in dict.fromkeys(os.path.realpath(m) for m in mounts if m):
        argv += ["--volume", f"{path}:{path}"]
    argv += ["--volume", f"{Path(respawn.__file__).resolve().parent}:{LIB_MOUNT}/respawn:ro"]
    names = sorted(n for n in env if n not in HOST_ONLY_ENV)
    for n in names:
        argv += ["--env", n]
    job_pythonpath = env.get("PYTHONPATH", "")
    argv += ["--env", f"PYTHONPATH={LIB_MOUNT}" + (f":{job_pythonpath}" if job_pythonpath else "")]
    if cwd:
        argv += ["--workdir", cwd]
    return [*argv, "--", image, *command]  # `--`: the image is never read as an option


class ContainerTrainer(TrainerProcess):
    """A TrainerProcess whose command is a `run` of the runtime (run_argv); its kill also
    removes the container, which a SIGKILL of the runtime's client leaves running."""

    def __init__(self, command: list[str], *, runtime: str, name: str, env: dict[str, str], log_path: str):
        super().__init__(command, env=env, cwd=None, log_path=log_path)
        self.runtime, self.name = runtime, name

    def start(self) -> None:
        self.remove()  # one left by an earlier agent on this VM (a restart) would hold the name
        super().start()

    def signal(self, signum: int) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            sent = subprocess.run([self.runtime, "kill", "--signal", signal.Signals(signum).name, self.name],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  timeout=30, check=False).returncode == 0
        except subprocess.TimeoutExpired:
            sent = False
        if not sent:  # no container yet (still being created), or a runtime that hangs: the client is all there is
            super().signal(signum)

    def kill(self) -> None:
        super().kill()
        self.remove()

    def remove(self) -> None:
        subprocess.run([self.runtime, "rm", "--force", self.name], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120, check=False)


def runtime_failure(code: int | None, output_tail: str) -> str | None:
    """Why the runtime, not the trainer, ended the run; None when the trainer's own status."""
    if code in RUNTIME_FAILURES:
        return RUNTIME_FAILURES[code]
    if code == 1 and INIT_EXEC_FAILED.search(output_tail):
        return "the command was not found in the image"
    return None


def pull_argv(runtime: str, image: str) -> list[str]:
    """Fetch the image unless the VM already has it (a prebuilt machine image, a restart)."""
    return ["sh", "-c", '"$0" image inspect -- "$1" >/dev/null 2>&1 || exec "$0" pull -- "$1"', runtime, image]
