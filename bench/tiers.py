"""The memory tier against its baselines, one run, loopback (issue 37's targets):

- notice save into a buddy's memory (the sender digesting as it sends, the buddy checking
  on receipt, its verdict awaited) / a raw TCP copy of the same bytes into a fresh
  buffer in another process, no digests: target <= 1.3;
- printed beside it: a periodic replica, whose digests the manifest already holds (the
  sender digests nothing);
- restore of a rank's shard from its buddy (checked before serving and on arrival) /
  restore of the same shard from storage (a moto S3 server, manifest digests checked):
  target <= 0.3; a local directory (page-cached) is printed beside it for scale;
- the buddy process's resident memory after several puts, in shards: target <= 1.05
  (one shard, plus allocator slack);
- steady step time with replication / without: two gloo ranks train a model of
  `--step-state-mib` (AdamW) under the packed Checkpointer, each node's buddy store a
  process of its own, in alternating phases of `--steps` steps with the memory tier
  and without it (no storage save in either); medians of per-phase medians, the worst
  rank: target <= 1.03. Each step also waits `--device-ms` after its CPU work, as a loop
  waits on its GPU, leaving the cores idle meanwhile: with the forward and backward on
  the CPU cores this machine has, nothing is left for the replication's idle-priority
  send, which never lands and is never measured (`--device-ms 0` shows that case). K is
  the default before any storage save is measured (the replication's stall held to 1 %
  of training time, its own time at least). Printed beside it, for scale: the same with
  the job's own K (`--own-k`), whose waits for each landing are the price of its bound;
- steps lost by a node SIGKILLed at a random step (with its store: the node is gone) in
  a gang of three under the job's own K (`--own-k`), each step waiting `--device-ms`,
  each rank's state `--step-state-mib`: the step the survivors reached less the newest
  step every old rank's shard is whole for on the two stores left (tiers/restore.py's
  plan, as a regroup would resume), worst of `--trials`, in K: target <= 1.

    .venv/bin/python bench/tiers.py [--size-gib 1] [--rounds 3] [--step-state-mib 64] [--steps 40] [--device-ms 40]
                                    [--own-k 5] [--trials 5] [--smoke] [--check]

Each round interleaves the methods; the ratios are medians of per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from respawn import protocol  # noqa: E402
from respawn.checkpoint import layout, manifest  # noqa: E402
from respawn.checkpoint.storage import open_storage  # noqa: E402
from respawn.checkpoint.tiers import Shard, fetch, held_for, replicate, settle, shard_from_storage, status  # noqa: E402
from respawn.checkpoint.tiers.restore import plan  # noqa: E402
from s3_upload import BUCKET, start_moto  # noqa: E402
from tests.checkpoint.ranks import fork_ranks, run_gang  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30
SAVE_TARGET = 1.3
RESTORE_TARGET = 0.3
MEMORY_TARGET = 1.05
STEADY_TARGET = 1.03
LOST_TARGET = 1.0  # in K
RANKS = 2
GANG = 3  # the lost-node row's: a node's shard survives on its buddy
TOKEN = "bench-token"
RANDOM_BLOCK = 64 * MIB  # repeated to fill a shard: urandom of a whole GiB costs seconds of CPU
_SIZE = struct.Struct(">Q")


def raw_sink() -> None:
    """The baseline's receiver: each connection's bytes into a fresh buffer, then one byte back."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        print("listening", *server.getsockname(), flush=True)
        while True:
            conn, _ = server.accept()
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                head = conn.recv(_SIZE.size, socket.MSG_WAITALL)
                (size,) = _SIZE.unpack(head)
                view = memoryview(bytearray(size))
                filled = 0
                while filled < size:
                    filled += conn.recv_into(view[filled:], 0, socket.MSG_WAITALL)
                conn.sendall(b"k")
                del view


def raw_copy(address, files: dict) -> None:
    with socket.create_connection(address) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(_SIZE.pack(sum(len(data) for data in files.values())))
        for data in files.values():
            sock.sendall(data)
        assert sock.recv(1) == b"k"


def spawn(argv: list[str]) -> tuple[subprocess.Popen, tuple[str, int]]:
    process = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, protocol.ENV_MEMORY_TIER_TOKEN: TOKEN})
    word, host, port = process.stdout.readline().split()
    assert word == "listening", word
    return process, (host, int(port))


def make_files(size: int) -> dict:
    block = os.urandom(min(RANDOM_BLOCK, size // 2))
    half = bytearray(size // 2)
    for offset in range(0, len(half), len(block)):
        half[offset : offset + len(block)] = block[: len(half) - offset]
    second = bytearray(half)
    second[:8] = b"second!!"  # two files, not one file twice
    return {layout.data_file(0, 0): half, layout.data_file(0, 1): second}


def commit_to(storage, files: dict, step: int) -> str:
    ckpt = layout.step_dir(step)
    entries = {}
    for name, data in files.items():
        writer = storage.open_writer(f"{ckpt}/{name}")
        writer.write(memoryview(data))
        writer.close()
        entries[name] = manifest.FileEntry(len(data), manifest.digest_bytes(data))
    manifest.commit(storage, ckpt, step, entries, {"step": step})
    return ckpt


def timed(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def training(rank: int, state_mib: int):
    """(a TrainState of `state_mib` MiB, its step): 4 square layers under AdamW, weights and
    two moments in fp32, the forward and backward on the CPU."""
    import torch

    from respawn.checkpoint import TrainState

    width = int((state_mib * MIB / 4 / 3 / 4) ** 0.5)
    torch.manual_seed(rank)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(4)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(32, width)

    def step() -> None:
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    return TrainState(model, optimizer), step


def steady_rank(rank: int, stores: list, state_mib: int, steps: int, rounds: int, device_s: float, own_k: int | None,
                out: Path) -> None:
    """One rank: `rounds` pairs of phases (without the tier, with it), `steps` timed steps each."""
    from respawn.checkpoint import CheckpointConfig, Checkpointer

    state, train_step = training(rank, state_mib)
    host, port = stores[rank]
    medians, every, step = {"off": [], "on": []}, None, 0
    with tempfile.TemporaryDirectory(prefix=f"bench-steady-{rank}-") as tmp:
        for _ in range(rounds):
            for phase in ("off", "on"):
                tier = {"memory_tier_addr": f"{host}:{port}", "memory_tier_token": TOKEN,
                        "replica_every_steps": own_k} if phase == "on" else {}
                ckpt = Checkpointer(state, CheckpointConfig(uri=tmp, interval_s=3600, handle_signals=False, **tier))
                times = []
                for _ in range(steps):
                    started = time.perf_counter()
                    train_step()
                    time.sleep(device_s)
                    step += 1  # on through the phases: a buddy takes only newer steps
                    ckpt.save(step)
                    times.append(time.perf_counter() - started)
                if phase == "on":
                    backend = ckpt.backend
                    every = backend.replicas.every_steps(step_s=backend._step_time_s, save_cost_s=None, interval_s=3600)
                ckpt.close()
                medians[phase].append(statistics.median(times[steps // 4:]))  # the first steps warm up
    out.write_text(json.dumps({"medians": medians, "every": every}))


def node_stores(world: int) -> list[tuple[subprocess.Popen, tuple[str, int]]]:
    """Each node's store, a process of its own, in its place on the ring."""
    return [spawn(["-m", "respawn.checkpoint.tiers", "--holds-for", str(held_for(rank, world)), "--own", str(rank)])
            for rank in range(world)]


def steady_ratio(state_mib: int, steps: int, rounds: int, device_s: float, own_k: int | None = None) -> tuple[float, list]:
    """Step time with the memory tier / without, worst rank; and each rank's K."""
    stores = node_stores(RANKS)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-steady-") as work:
            codes = run_gang(RANKS, lambda rank: steady_rank(rank, [at for _, at in stores], state_mib, steps, rounds,
                                                             device_s, own_k, Path(work, f"{rank}.json")), timeout_s=120)
            if codes != [0] * RANKS:
                raise SystemExit(f"steady ranks exited with {codes}")
            ranks = [json.loads(Path(work, f"{rank}.json").read_text()) for rank in range(RANKS)]
    finally:
        for process, _ in stores:
            process.kill()
            process.wait()
    ratios = [statistics.median(on / off for on, off in zip(r["medians"]["on"], r["medians"]["off"])) for r in ranks]
    return max(ratios), [r["every"] for r in ranks]


def lost_rank(rank: int, port: int, stores: list, state_mib: int, device_s: float, own_k: int, reached: Path) -> None:
    """One rank of the gang of three: trains, appending each step it reaches to `reached`,
    until its gang fails under it (a node is killed) or a thousand steps."""
    from respawn.checkpoint import CheckpointConfig, Checkpointer
    from respawn.checkpoint.distributed import init_process_group

    init_process_group("gloo", timeout_s=30, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=GANG)
    state, train_step = training(rank, state_mib)
    host, store_port = stores[rank]
    with tempfile.TemporaryDirectory(prefix=f"bench-lost-{rank}-") as tmp, reached.open("a") as out:
        ckpt = Checkpointer(state, CheckpointConfig(uri=tmp, interval_s=3600, handle_signals=False, replica_every_steps=own_k,
                                                    memory_tier_addr=f"{host}:{store_port}", memory_tier_token=TOKEN))
        for step in range(1, 1001):
            train_step()
            time.sleep(device_s)
            ckpt.save(step)
            out.write(f"{step}\n")
            out.flush()


def steps_reached(path: Path) -> int:
    lines = path.read_text().split() if path.exists() else []
    return int(lines[-1]) if lines else 0


def lost_steps(state_mib: int, device_s: float, own_k: int, kill_at: int) -> int:
    """A gang of three trains; once rank 0 reached `kill_at`, node 2 (its rank and its store)
    is SIGKILLed. The steps the survivors reached beyond the newest step the two stores
    left hold whole for every old rank (nothing whole: all of them)."""
    stores = node_stores(GANG)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-lost-") as work:
            reached = [Path(work, f"{rank}.steps") for rank in range(GANG)]
            pids = fork_ranks(GANG, lambda rank, port: lost_rank(rank, port, [at for _, at in stores], state_mib,
                                                                 device_s, own_k, reached[rank]))
            deadline = time.monotonic() + 120
            while steps_reached(reached[0]) < kill_at and time.monotonic() < deadline:
                time.sleep(0.002)
            os.kill(pids[-1], signal.SIGKILL)
            stores[-1][0].kill()
            # The survivors fail at their next collective; whatever they reached until then is lost work.
            running = set(pids[:-1])  # a pid waited for once is gone: waiting again would raise
            while running and time.monotonic() < deadline + 60:
                running -= {pid for pid in running if os.waitpid(pid, os.WNOHANG) != (0, 0)}
                time.sleep(0.05)
            for pid in [*running, pids[-1]]:
                try:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass
            if steps_reached(reached[0]) < kill_at:
                raise SystemExit(f"the gang never reached step {kill_at}")
            holdings = [status(at, TOKEN)["replicas"] for _, at in stores[:-1]]
            found = plan(holdings, GANG, newer_than=0)
            return max(steps_reached(path) for path in reached[:-1]) - (found[0] if found else 0)
    finally:
        for process, _ in stores:
            process.kill()
            process.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gib", type=float, default=1.0, help="one rank's shard (the issue asks >= 1)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="4 MiB, one round: that it runs, not what it measures")
    parser.add_argument("--step-state-mib", type=int, default=64, help="each rank's state in the steady-step row")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per phase of the steady-step row")
    parser.add_argument("--device-ms", type=float, default=40.0,
                        help="each steady step's wait after its CPU work, as on a GPU (0: a loop that leaves no core idle)")
    parser.add_argument("--own-k", type=int, default=5, help="the job's own K in the lost-node row and its steady row")
    parser.add_argument("--trials", type=int, default=5, help="nodes killed, each at a random step, in the lost-node row")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--raw-sink", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device_ms < 0:
        parser.error("--device-ms must be >= 0")
    if args.own_k < 1 or args.trials < 1:
        parser.error("--own-k and --trials must be >= 1")
    if args.raw_sink:
        raw_sink()
        return 0
    size = 4 * MIB if args.smoke else int(args.size_gib * GIB)
    rounds = 1 if args.smoke else args.rounds

    files = make_files(size)
    buddy, buddy_at = spawn(["-m", "respawn.checkpoint.tiers", "--holds-for", "0"])
    sink, sink_at = spawn([__file__, "--raw-sink"])
    moto, endpoint = start_moto()
    os.environ.update(AWS_ENDPOINT_URL_S3=endpoint, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1")
    try:
        import boto3

        boto3.client("s3").create_bucket(Bucket=BUCKET)
        bucket = open_storage(f"s3://{BUCKET}/tiers")
        with tempfile.TemporaryDirectory(prefix="bench-tiers-") as tmp:
            local = open_storage(tmp)
            ckpt = commit_to(bucket, files, 1)
            commit_to(local, files, 1)
            committed = shard_from_storage(local, ckpt, 0)  # with state.json: the shard a rank holds
            files = committed.files
            buddy_before = rss(buddy.pid)
            save, restore, times = [], [], {k: [] for k in ("raw", "buddy", "periodic", "fetch", "bucket", "local")}
            for round_ in range(rounds):
                times["raw"].append(timed(lambda: raw_copy(sink_at, files)))
                times["buddy"].append(timed(lambda: replicate(buddy_at, TOKEN, Shard(0, 10 + 2 * round_, files, {}))))
                periodic = Shard(0, 11 + 2 * round_, files, committed.digests)  # the manifest's: none computed
                times["periodic"].append(timed(lambda: replicate(buddy_at, TOKEN, periodic)))
                settle(buddy_at, TOKEN, 0, periodic.step)  # as a gang does once every rank's has landed
                fetched = []
                times["fetch"].append(timed(lambda: fetched.append(fetch(buddy_at, TOKEN, 0))))
                times["bucket"].append(timed(lambda: shard_from_storage(bucket, ckpt, 0)))
                times["local"].append(timed(lambda: shard_from_storage(local, ckpt, 0)))
                assert all(bytes(fetched[0].files[n]) == bytes(files[n]) for n in files), "a restore differs"
                save.append(times["buddy"][-1] / times["raw"][-1])
                restore.append(times["fetch"][-1] / times["bucket"][-1])
                del fetched
            held = status(buddy_at, TOKEN)
            memory = (rss(buddy.pid) - buddy_before) / held["replicas"][0][2]
    finally:
        for process in (buddy, sink, moto):
            process.kill()
            process.wait()

    state_mib, steps = (4, 12) if args.smoke else (args.step_state_mib, args.steps)
    steady, every = steady_ratio(state_mib, steps, rounds + 1, args.device_ms / 1000)
    starved = steady_ratio(state_mib, steps, rounds + 1, 0.0) if args.device_ms > 0 else None
    bounded = steady_ratio(state_mib, steps, rounds + 1, args.device_ms / 1000, args.own_k)[0]
    trials = 1 if args.smoke else args.trials
    print(f"killing a node of a gang of {GANG} in each of {trials} trial(s): the survivors' broken collectives are "
          f"said below, as they fail", flush=True)
    draw = random.Random(37)
    lost = [lost_steps(state_mib, args.device_ms / 1000, args.own_k, draw.randint(2 * args.own_k, 5 * args.own_k))
            for _ in range(trials)]

    shard_gib = sum(len(d) for d in files.values()) / GIB
    gbps = {k: shard_gib * GIB / statistics.median(v) / 1e9 for k, v in times.items()}
    print(f"one rank's shard: {shard_gib:.3f} GiB, {rounds} round(s), loopback, buddy and sink in their own processes")
    for name, what in (("raw", "raw TCP copy"), ("buddy", "notice save into buddy memory"),
                       ("periodic", "periodic replica (manifest's digests)"), ("fetch", "restore from buddy"),
                       ("bucket", "restore from S3 (moto)"), ("local", "restore from local dir (page-cached)")):
        print(f"  {what:40s} median {statistics.median(times[name]):7.3f} s  {gbps[name]:6.2f} GB/s")
    print(f"steady steps: {RANKS} gloo ranks, {state_mib} MiB of state each, {steps} steps a phase, each waiting "
          f"{args.device_ms:g} ms as on a GPU; K chosen: {every}")
    results = [
        ("notice save into buddy memory / raw TCP copy", statistics.median(save), SAVE_TARGET),
        ("restore from buddy / restore from S3 (moto)", statistics.median(restore), RESTORE_TARGET),
        ("buddy's extra resident memory, in shards", memory, MEMORY_TARGET),
        ("steady step time with replication / without", steady, STEADY_TARGET),
        (f"steps lost by a SIGKILLed node, in K = {args.own_k}", max(lost) / args.own_k, LOST_TARGET),
    ]
    missed = False
    for what, ratio, target in results:
        ok = ratio <= target
        missed |= not ok
        print(f"{what:48s} {ratio:6.3f}  target <= {target}  {'ok' if ok else 'MISSED'}")
    scale = f"  for scale, the job's own K = {args.own_k} (its waits)"
    print(f"{scale:48s} {bounded:6.3f}  (no target: the price of its bound)")
    print(f"{'  steps lost in each trial':48s} {lost}")
    if starved is not None:
        print(f"{'  for scale, steps that leave no core idle':48s} {starved[0]:6.3f}  (no target: the send starves; "
              f"K chosen: {starved[1]})")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
