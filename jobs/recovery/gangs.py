"""A job's gang: the live nodes that hold its slots, its joiners, the size it trains
on now, when it runs, and the address its ranks rendezvous at."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from respawn.protocol import Purpose
from respawn_server.jobs.core.choices import InstanceState, JobStatus
from respawn_server.jobs.core.transitions import transition_job
from respawn_server.jobs.models import Instance, Job


GANG_PORT = 29500  # torch.distributed's customary rendezvous port on rank 0's host


def training_nodes(job_id: int):
    """The job's live training instances that hold a node slot (not spares, not joiners,
    not a post step)."""
    return Instance.objects.filter(job_id=job_id, state__in=InstanceState.LIVE, standby_for__isnull=True,
                                   joining=False, purpose=Purpose.TRAIN)


def live_joiners(job_id: int):
    """The job's live joiners: launched to grow its elastic gang back (docs/elastic.md)."""
    return Instance.objects.filter(job_id=job_id, state__in=InstanceState.LIVE, joining=True)


def current_world_size(job: Job) -> int:
    """The nodes the job's gang trains on now: its newest world size, else all it asked for."""
    return job.world_sizes.order_by("-at", "-id").values_list("world_size", flat=True).first() or job.nodes


def running_once_all_registered(job: Job) -> None:
    """A provisioning job runs once every node of its gang has registered (an elastic
    gang's, as many as it has regrouped to)."""
    nodes = training_nodes(job.pk)
    if job.status == JobStatus.PROVISIONING and nodes.exists() and not nodes.exclude(
            state=InstanceState.RUNNING).exists() and nodes.count() == current_world_size(job):
        transition_job(job.pk, JobStatus.PROVISIONING, JobStatus.RUNNING, message="every node registered")


def gang_rendezvous(job: Job, placement) -> str:
    """rank 0's torch.distributed address. Local "VMs" share this machine, so a free
    port here is known before launch; on a cloud it is rank 0's host, set when rank 0
    registers (respawn_server.jobs.reports.registration.register_instance)."""
    if job.nodes == 1 or placement.provider != "local":
        return ""
    return free_local_address()


def free_local_address() -> str:
    """A rendezvous address for a gang of local "VMs", which share this machine: a port
    free here now, below the kernel's ephemeral range. A port from that range (bind to
    0) can be taken by any outgoing connection (a heartbeat, a query) in the seconds
    before rank 0's trainer binds it, and the gang's trainers then fail on EADDRINUSE."""
    ephemeral_low = _lowest_ephemeral_port()
    for port in random.sample(range(max(1024, ephemeral_low - 16384), ephemeral_low), 64):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return f"127.0.0.1:{port}"
    raise OSError("no free port below the ephemeral range for a local gang's rendezvous")


def _lowest_ephemeral_port() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; other systems' ranges start higher
