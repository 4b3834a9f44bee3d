"""The job's prepare step: run once, stored durably by content hash, reused on relaunch.

    python -m respawn.agent.prepare --storage URI --out DIR --result FILE \\
        [--cwd DIR] [--input PATH ...] [--no-store] -- COMMAND ...

The agent runs this as a child it supervises like the trainer (heartbeats go on,
a notice or a stop ends it), before it starts the trainer.

Key: the SHA-256 of the canonical JSON of {"format", "command": the argv,
"inputs": {path: SHA-256 of its bytes}}, where `inputs` are the paths the job
declares (`prepare_inputs`, relative to the working directory; a directory stands
for every file under it, named `dir/sub/file`). Nothing else goes in: not the
job's env, not data the command downloads. Change the command (e.g. a version
argument) or an input file to make the step run again.

Storage, under the job's checkpoint storage (`--storage`):

    prepare/<key>/outputs/<path>      every file the command wrote under $RESPAWN_PREPARE_DIR
    prepare/<key>/MANIFEST.json       size and xxh3-128 digest of each, written LAST

Outputs count only once their manifest exists (the checkpoint commit protocol,
DESIGN §6). With a manifest present the command is skipped and the outputs are
fetched into `--out`, each file checked against its digest; a damaged copy is
uncommitted and the command runs again. Without one the command runs with
$RESPAWN_PREPARE_DIR = `--out` (emptied first), and what it left there is stored
(unless `--no-store`: ranks > 0 of a gang use their own copy, rank 0 stores).
Empty directories and anything written elsewhere are not kept.

The outcome goes to `--result` as JSON {outcome, key, uri, seconds, message}.
Exit status: 0 when the outputs are in place, the command's own status when it
failed, 2 when an input is missing or storage refused.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from respawn import protocol
from respawn.agent.supervisor import die_with_parent
from respawn.checkpoint.manifest import ALGORITHM, new_digest
from respawn.checkpoint.storage import Storage, StorageError, open_storage

FORMAT = "respawn-prepare/1"
MANIFEST = "MANIFEST.json"
CHUNK = 8 << 20
LINE_PREFIX = f"{protocol.AGENT_LINE_PREFIX} prepare:"  # the logs API marks these as the agent's lines


class PrepareError(Exception):
    """The step cannot run or its outputs cannot be kept; the message says why."""


class DamagedOutputs(PrepareError):
    """Stored outputs do not match their manifest."""


@dataclass
class Result:
    outcome: str
    key: str = ""
    uri: str = ""
    seconds: float | None = None
    message: str = ""


# --- the key ------------------------------------------------------------------------
def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def input_digests(inputs: list[str], cwd: str) -> dict[str, str]:
    """{name: sha256} of every declared input; a directory gives one entry per file under it."""
    digests: dict[str, str] = {}
    for declared in inputs:
        path = Path(cwd, declared)
        if path.is_file():
            digests[declared] = _sha256_file(path)
        elif path.is_dir():
            for file in sorted(p for p in path.rglob("*") if p.is_file()):
                digests[f"{declared.rstrip('/')}/{file.relative_to(path).as_posix()}"] = _sha256_file(file)
        else:
            raise PrepareError(f"prepare input {declared!r} does not exist (looked for {path})")
    return digests


def prepare_key(command: list[str], inputs: dict[str, str]) -> str:
    canonical = json.dumps({"format": FORMAT, "command": command, "inputs": inputs}, sort_keys=True,
                           separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


# --- storing and fetching -----------------------------------------------------------------
def _files_under(directory: Path) -> list[tuple[str, Path]]:
    return sorted((p.relative_to(directory).as_posix(), p) for p in directory.rglob("*") if p.is_file())


def _upload(storage: Storage, key: str, path: Path) -> dict:
    writer = storage.open_writer(key)
    digest, size = new_digest(), 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                writer.write(chunk)
                digest.update(chunk)
                size += len(chunk)
    except BaseException:
        writer.abort()
        raise
    writer.close()
    return {"size": size, "digest": digest.hexdigest()}


def store(storage: Storage, key: str, out_dir: Path, description: dict) -> int:
    """Upload every file under `out_dir`, then the manifest; returns the bytes stored."""
    files = {name: _upload(storage, f"prepare/{key}/outputs/{name}", path) for name, path in _files_under(out_dir)}
    body = {"format": FORMAT, "key": key, **description, "created_at": datetime.now(timezone.utc).isoformat(),
            "digest_algorithm": ALGORITHM, "files": files}
    storage.write_atomic(f"prepare/{key}/{MANIFEST}", json.dumps(body, indent=1).encode())
    return sum(entry["size"] for entry in files.values())


def _read_manifest(storage: Storage, key: str) -> dict | None:
    name = f"prepare/{key}/{MANIFEST}"
    if not storage.exists(name):
        return None
    try:
        body = json.loads(storage.read(name))
        files = body["files"]
        if body.get("digest_algorithm") != ALGORITHM or not isinstance(files, dict):
            raise ValueError(f"not a {FORMAT} manifest with {ALGORITHM} digests")
        for file, entry in files.items():
            if not file or file.startswith("/") or ".." in file.split("/") or not isinstance(entry, dict):
                raise ValueError(f"bad file entry {file!r}")
        return body
    except (ValueError, KeyError, TypeError) as exc:
        raise DamagedOutputs(f"{storage.url_for(name)} is unreadable: {exc}") from None


def fetch(storage: Storage, key: str, out_dir: Path) -> int | None:
    """The stored outputs of `key` copied into `out_dir` and checked; None when none are stored."""
    manifest = _read_manifest(storage, key)
    if manifest is None:
        return None
    total = 0
    for name, entry in manifest["files"].items():
        source, dest = f"prepare/{key}/outputs/{name}", out_dir / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        digest, size = new_digest(), 0
        with storage.open_reader(source) as reader, open(dest, "wb") as f:
            while chunk := reader.read(CHUNK):
                f.write(chunk)
                digest.update(chunk)
                size += len(chunk)
        if size != entry.get("size") or digest.hexdigest() != entry.get("digest"):
            raise DamagedOutputs(f"{storage.url_for(source)} does not match its manifest (size {size}, "
                                 f"manifest {entry.get('size')})")
        total += size
    return total


# --- the step -------------------------------------------------------------------------
def _say(message: str) -> None:
    print(f"{LINE_PREFIX} {message}", flush=True)


def _fresh_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode  # killed by a signal: the shell's convention


def run_step(args: argparse.Namespace) -> tuple[int, Result]:
    started = time.monotonic()
    out_dir = Path(args.out)
    digests = input_digests(args.input, args.cwd)
    key = prepare_key(args.command, digests)
    storage = open_storage(args.storage)
    uri = storage.url_for(f"prepare/{key}")
    _fresh_dir(out_dir)
    try:
        fetched = fetch(storage, key, out_dir)
    except (DamagedOutputs, StorageError) as exc:
        _say(f"stored outputs unusable ({exc}); running the command again")
        storage.delete_prefix(f"prepare/{key}/{MANIFEST}")
        _fresh_dir(out_dir)
        fetched = None
    if fetched is not None:
        _say(f"outputs for key {key[:12]} already stored at {uri}: fetched {fetched} bytes, command skipped")
        return 0, Result(protocol.PrepareOutcome.REUSED, key, uri, time.monotonic() - started)
    _say(f"running {args.command!r} (key {key[:12]}), outputs in {out_dir}")
    try:
        code = subprocess.run(args.command, cwd=args.cwd, stdin=subprocess.DEVNULL,
                              preexec_fn=die_with_parent(os.getpid())).returncode
    except OSError as exc:
        raise PrepareError(f"could not start the prepare command {args.command!r}: {exc}") from None
    if code != 0:
        message = f"the prepare command exited with code {code}"
        return _exit_status(code), Result(protocol.PrepareOutcome.FAILED, key, "", time.monotonic() - started, message)
    if not args.store:
        return 0, Result(protocol.PrepareOutcome.RAN, key, "", time.monotonic() - started)
    stored = store(storage, key, out_dir, {"command": args.command, "inputs": digests})
    _say(f"stored {stored} bytes of outputs at {uri}")
    return 0, Result(protocol.PrepareOutcome.RAN, key, uri, time.monotonic() - started)


def read_result(path: str) -> Result:
    """The step's outcome as the runner wrote it; `failed` when it wrote none (it was killed)."""
    try:
        with open(path) as f:
            return Result(**json.load(f))
    except (OSError, ValueError, TypeError):
        return Result(protocol.PrepareOutcome.FAILED, message="the prepare step ended without saying how")


def runner_command(job: protocol.JobSpec, *, out_dir: str, result: str, store: bool) -> list[str]:
    """How the agent starts this module for `job` (cwd: the agent's, so `agents` imports)."""
    command = [sys.executable, "-m", "respawn.agent.prepare", "--storage", job.checkpoint_uri, "--out", out_dir,
               "--result", result, "--cwd", job.working_dir or os.getcwd()]
    for path in job.prepare_inputs:
        command += ["--input", path]
    return [*command, *([] if store else ["--no-store"]), "--", *job.prepare_command]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m respawn.agent.prepare", description=__doc__.split("\n")[0])
    parser.add_argument("--storage", required=True, help="the job's checkpoint storage URI")
    parser.add_argument("--out", required=True, help="local directory for the outputs ($RESPAWN_PREPARE_DIR)")
    parser.add_argument("--result", required=True, help="file the outcome is written to (JSON)")
    parser.add_argument("--cwd", default=os.getcwd(), help="the job's working directory")
    parser.add_argument("--input", action="append", default=[], help="a declared input (repeatable)")
    parser.add_argument("--no-store", dest="store", action="store_false", help="run or fetch, but do not store")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not args.command:
        parser.error("the prepare command is missing (after --)")
    try:
        code, result = run_step(args)
    except (PrepareError, StorageError, OSError) as exc:
        _say(f"failed: {exc}")
        code, result = 2, Result(protocol.PrepareOutcome.FAILED, message=str(exc))
    tmp = f"{args.result}.tmp"
    with open(tmp, "w") as f:
        json.dump(asdict(result), f)
    os.replace(tmp, args.result)
    return code


if __name__ == "__main__":
    sys.exit(main())
