"""Plain helpers for the local provider's tests (no Django: the launcher process imports them)."""

from __future__ import annotations

import sys
from pathlib import Path

from respawn_server.jobs.fleet.providers.base import LaunchRequest, Placement
from respawn_server.jobs.fleet.providers.local_vm import proc_stat

REPO = Path(__file__).resolve().parents[2]
# The published traces (../shared/data/spot-traces), in the checkout or beside it.
SPOT_TRACES = REPO / "data" / "spot-traces"
AWS_V100_TRACE = str(SPOT_TRACES / "preemption/1-node/aws-04-22-2023/us-west-2b_v100_1.json")
STANDIN_AGENT = (sys.executable, str(Path(__file__).with_name("standin_agent.py")))
# Agent settings in fractions of a second, so notices and exits are seen at once.
FAST_AGENT_ENV = {
    "RESPAWN_HEARTBEAT_INTERVAL_S": "0.2",
    "RESPAWN_NOTICE_POLL_S": "0.2",
    "RESPAWN_TICK_S": "0.05",
    "RESPAWN_LOG_BATCH_INTERVAL_S": "0.2",
    "RESPAWN_BACKOFF_BASE_S": "0.05",
    "RESPAWN_BACKOFF_MAX_S": "0.3",
    "RESPAWN_DRAIN_TIMEOUT_S": "3",
    "RESPAWN_VALIDATE": "0",
}


def launch_request(instance_id: int, *, zone: str = "local-a", market: str = "spot", job_id: int = 1,
                   bootstrap_token: str = "rsp_boot_test", control_plane_url: str = "http://127.0.0.1:9") -> LaunchRequest:
    return LaunchRequest(
        job_id=job_id,
        instance_id=instance_id,
        client_token=f"token-{instance_id}",
        placement=Placement(provider="local", region="local", zone=zone, instance_type="cpu-small", market=market),
        user_data="",
        bootstrap_token=bootstrap_token,
        control_plane_url=control_plane_url,
    )


def alive(pid: int) -> bool:
    stat = proc_stat(pid)  # a zombie waiting for init to reap it is not alive
    return stat is not None and stat.state not in ("Z", "X")
