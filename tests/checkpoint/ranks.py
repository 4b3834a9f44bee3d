"""Ranks as forked processes, for the gang tests and bench/distributed.py."""

from __future__ import annotations

import os
import socket

import torch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fork_ranks(world: int, run_rank) -> list[int]:
    """Fork one process per rank running `run_rank(rank, port)` (port: free, for rank 0's
    store); a rank exits 0 when it returns, 1 when it raises."""
    port = free_port()
    pids = []
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                torch.set_num_threads(1)
                run_rank(rank, port)
                code = 0
            except BaseException as exc:
                print(f"rank {rank} failed: {type(exc).__name__}: {exc}", flush=True)
            finally:
                os._exit(code)
        pids.append(pid)
    return pids


def wait_all(pids: list[int]) -> list[int]:
    return [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]


def run_gang(world: int, body, timeout_s: float = 60) -> list[int]:
    """`body(rank)` on `world` forked ranks joined in a gloo group (torch.distributed's
    default one, with the checkpoint library's short timeout); their exit codes."""
    from respawn.checkpoint.distributed import init_process_group, leave_process_group

    def run(rank: int, port: int) -> None:
        init_process_group("gloo", timeout_s=timeout_s, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        body(rank)
        leave_process_group()
    return wait_all(fork_ranks(world, run))
