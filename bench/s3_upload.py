"""Upload throughput of S3Storage.open_writer against boto3's own `upload_file`
of the same bytes, both to one moto server (a separate process on 127.0.0.1),
measured in the same run with the two methods interleaved.

    .venv/bin/python bench/s3_upload.py [--mib 64] [--rounds 15] [--check]

Prints each method's median throughput and client CPU, and the median of the
per-round throughput ratios beside its target (>= 1.0);
`--check` exits non-zero on a miss.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import boto3
import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from respawn.checkpoint.storage import open_storage  # noqa: E402

MIB = 1024 * 1024
TARGET_RATIO = 1.0
WRITE_CHUNK = 16 * MIB  # how the Checkpointer's persist feeds a writer
BUCKET = "bench"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_moto() -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"moto server exited with {process.returncode}")
        try:
            requests.get(f"{endpoint}/moto-api/", timeout=1)
            return process, endpoint
        except requests.ConnectionError:
            time.sleep(0.2)
    process.kill()
    sys.exit("moto server did not answer within 30 s")


def upload_with_writer(storage, data: memoryview) -> None:
    writer = storage.open_writer("writer.bin")
    try:
        for offset in range(0, len(data), WRITE_CHUNK):
            writer.write(data[offset : offset + WRITE_CHUNK])
    except BaseException:
        writer.abort()
        raise
    writer.close()


def measure(action, nbytes: int) -> tuple[float, float]:
    """(MiB/s, client CPU seconds per GiB): the server is shared, so the client's
    own CPU is the steadier figure when the machine is busy."""
    wall, cpu = time.perf_counter(), time.process_time()
    action()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return nbytes / MIB / wall, cpu / (nbytes / (1024 * MIB))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=64, help="object size in MiB (default 64)")
    parser.add_argument("--rounds", type=int, default=15, help="uploads per method (default 15); moto shares 2 busy cores, so short runs swing by +-0.2")
    parser.add_argument("--check", action="store_true", help=f"exit 1 if the ratio is below {TARGET_RATIO}")
    parser.add_argument("--smoke", action="store_true",
                        help="1 MiB, one round: the suite's run that keeps the bench working")
    args = parser.parse_args()
    if args.smoke:
        args.mib, args.rounds = 1, 1
    if args.mib < 1 or args.rounds < 1:
        parser.error("--mib and --rounds must be at least 1")

    process, endpoint = start_moto()
    os.environ.update(
        AWS_ENDPOINT_URL_S3=endpoint, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
    )
    try:
        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        storage = open_storage(f"s3://{BUCKET}/upload")
        data = os.urandom(args.mib * MIB)
        with tempfile.NamedTemporaryFile(prefix="s3-bench-") as source:
            source.write(data)
            source.flush()  # upload_file reads it back from the page cache
            methods = {
                "S3Storage.open_writer": lambda: upload_with_writer(storage, memoryview(data)),
                "boto3 upload_file": lambda: client.upload_file(source.name, BUCKET, "upload/boto3.bin"),
            }
            results: dict[str, list[tuple[float, float]]] = {name: [] for name in methods}
            for round_ in range(args.rounds):
                # Alternate who goes first, so drift in the machine's load hits both.
                order = list(methods) if round_ % 2 == 0 else list(reversed(methods))
                for name in order:
                    results[name].append(measure(methods[name], len(data)))
                    storage.delete_prefix("")  # keep moto's memory flat between uploads
    finally:
        process.kill()
        process.wait()

    print(f"object: {args.mib} MiB, {args.rounds} rounds each, moto server in its own process, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    medians = {}
    for name, runs in results.items():
        medians[name] = statistics.median(rate for rate, _ in runs)
        cpu = statistics.median(cpu for _, cpu in runs)
        print(f"{name:22s}: median {medians[name]:6.1f} MiB/s ({', '.join(f'{rate:.1f}' for rate, _ in runs)}); "
              f"client CPU {cpu:.2f} s/GiB")
    # Each round's two uploads ran back to back under the same machine load, so
    # the median of per-round ratios is steadier than a ratio of medians.
    ratio = statistics.median(
        ours / theirs for (ours, _), (theirs, _) in zip(results["S3Storage.open_writer"], results["boto3 upload_file"])
    )
    verdict = "ok" if ratio >= TARGET_RATIO else "MISS"
    print(f"upload throughput ratio (median of per-round ratios) {ratio:.2f}  (target >= {TARGET_RATIO})  {verdict}")
    return 1 if args.check and ratio < TARGET_RATIO else 0


if __name__ == "__main__":
    sys.exit(main())
