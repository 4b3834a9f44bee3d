"""MANIFEST.json: the commit record of a checkpoint (DESIGN §6).

The digest is xxh3-128: on 2 shared cores sha256 costs ~0.8 s of CPU per GiB and
would slow training while a background persist runs; xxh3 costs a few percent of
that and still catches truncation, bit rot and torn writes. (It is not a defence
against deliberate tampering: validation is.)
"""

from __future__ import annotations

import json
import mmap
from dataclasses import dataclass
from datetime import datetime, timezone

import xxhash

from respawn.protocol import CheckpointTier

from . import layout
from .errors import CorruptCheckpointError
from .storage import Storage, StorageError

ALGORITHM = "xxh3_128"
READ_CHUNK = 8 << 20


def new_digest():
    return xxhash.xxh3_128()


def digest_bytes(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


@dataclass(frozen=True)
class FileEntry:
    size: int
    digest: str

    def to_json(self) -> dict:
        return {"size": self.size, "digest": self.digest}


@dataclass(frozen=True)
class Manifest:
    step: int
    files: dict[str, FileEntry]
    raw: bytes  # as stored, so its digest can be reported
    # Where the step was held as it committed (DESIGN §12): storage, and the memory tier
    # when every rank's replica of it was whole in the gang's stores then. A manifest
    # written before tiers were recorded says nothing: storage alone.
    tiers: tuple[str, ...] = (CheckpointTier.STORAGE,)

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.files.values())

    @property
    def digest(self) -> str:
        return f"{ALGORITHM}:{digest_bytes(self.raw)}"


def encode(step: int, files: dict[str, FileEntry], created_at: str,
           tiers: tuple[str, ...] = (CheckpointTier.STORAGE,)) -> bytes:
    body = {
        "format": layout.FORMAT,
        "step": step,
        "created_at": created_at,
        "digest_algorithm": ALGORITHM,
        "tiers": list(tiers),
        "files": {name: entry.to_json() for name, entry in sorted(files.items())},
    }
    return json.dumps(body, indent=1).encode()


def read(storage: Storage, ckpt: str) -> Manifest:
    """The manifest of checkpoint directory `ckpt`; raises CorruptCheckpointError
    naming the checkpoint when it is missing or malformed."""
    where = storage.url_for(ckpt)
    key = f"{ckpt}/{layout.MANIFEST}"
    if not storage.exists(key):
        raise CorruptCheckpointError(f"checkpoint {where} has no {layout.MANIFEST}: it was never committed")
    raw = storage.read(key)
    try:
        body = json.loads(raw)
        if not isinstance(body, dict) or not isinstance(body.get("files"), dict):
            raise ValueError("not an object with a 'files' object")
        if body["digest_algorithm"] != ALGORITHM:
            raise ValueError(f"digest algorithm {body['digest_algorithm']!r} is not {ALGORITHM!r}")
        files = {_file_name(name): FileEntry(_count(e["size"], f"size of {name}"), _text(e["digest"], f"digest of {name}"))
                 for name, e in body["files"].items()}
        return Manifest(step=_count(body["step"], "step"), files=files, raw=raw, tiers=_tiers(body.get("tiers")))
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptCheckpointError(f"checkpoint {where}: {layout.MANIFEST} is malformed ({exc})") from None


def commit(storage: Storage, ckpt: str, step: int, files: dict[str, FileEntry], state: dict,
           tiers: tuple[str, ...] = (CheckpointTier.STORAGE,)) -> tuple[Manifest, str]:
    """The commit of checkpoint `ckpt` whose data `files` are durable: its state.json, then
    MANIFEST.json naming them, it and the `tiers` holding the step, then LATEST (DESIGN §6).
    Returns the manifest and its creation time."""
    state_bytes = json.dumps(state).encode()
    storage.write_atomic(f"{ckpt}/{layout.STATE}", state_bytes)
    files = files | {layout.STATE: FileEntry(len(state_bytes), digest_bytes(state_bytes))}
    created = datetime.now(timezone.utc).isoformat()
    raw = encode(step, files, created, tiers)
    storage.write_atomic(f"{ckpt}/{layout.MANIFEST}", raw)
    storage.write_atomic(layout.LATEST, ckpt.encode())
    return Manifest(step, files, raw, tiers), created


def _count(value, what: str) -> int:
    if type(value) is not int or value < 0:  # not bool, not 1.5, not "7"
        raise ValueError(f"{what} is {value!r}, not a non-negative whole number")
    return value


def _text(value, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} is {value!r}, not text")
    return value


def _tiers(value) -> tuple[str, ...]:
    if value is None:
        return (CheckpointTier.STORAGE,)
    if not isinstance(value, list) or CheckpointTier.STORAGE not in value or not set(value) <= set(CheckpointTier.ALL):
        raise ValueError(f"tiers {value!r} is not a list of {', '.join(CheckpointTier.ALL)} naming storage")
    return tuple(value)


def _file_name(name: str) -> str:
    """A manifest names files inside its own checkpoint directory only."""
    if not name or name.startswith("/") or ".." in name.split("/"):
        raise ValueError(f"file name {name!r} is not inside the checkpoint")
    return name


def read_verified(storage: Storage, ckpt: str, name: str, entry: FileEntry) -> bytearray | mmap.mmap:
    """The whole of one file, after checking it against its manifest entry."""
    where = storage.url_for(f"{ckpt}/{name}")
    key = f"{ckpt}/{name}"
    try:
        actual_size = storage.size(key)
    except StorageError:
        raise CorruptCheckpointError(f"checkpoint {storage.url_for(ckpt)}: file {name} named in the manifest is missing") from None
    if actual_size != entry.size:
        raise CorruptCheckpointError(
            f"checkpoint {storage.url_for(ckpt)}: file {name} is {actual_size} bytes, manifest says {entry.size} (truncated or overwritten)"
        )
    # A backend that can map files (local disks) hands over the page cache itself:
    # no copy of the bytes and no fresh pages to fault in, half of a validation's time.
    map_private = getattr(storage, "map_private", None)
    if map_private is not None and entry.size:
        data = map_private(key)
        if len(data) != entry.size:
            raise CorruptCheckpointError(f"{where}: {len(data)} bytes, manifest says {entry.size} (truncated or overwritten)")
        digest = new_digest()
        digest.update(data)
        filled = entry.size
    else:
        data, filled, digest = _read_whole(storage, key, entry.size)
    if filled != entry.size:
        raise CorruptCheckpointError(f"{where}: read {filled} of {entry.size} bytes (truncated)")
    if digest.hexdigest() != entry.digest:
        raise CorruptCheckpointError(f"checkpoint {storage.url_for(ckpt)}: file {name} fails its {ALGORITHM} digest (corrupted)")
    return data


def _read_whole(storage: Storage, key: str, size: int):
    """(bytes, how many arrived, their digest): read in chunks straight into the result."""
    data = bytearray(size)
    view = memoryview(data)
    digest = new_digest()
    filled = 0
    with storage.open_reader(key) as reader:
        # Straight into the result where the reader can (files): no chunk copied twice.
        readinto = getattr(reader, "readinto", None)
        while filled < size:
            window = view[filled : filled + min(READ_CHUNK, size - filled)]
            if readinto is not None:
                got = readinto(window) or 0
            else:
                chunk = reader.read(len(window))
                got = len(chunk)
                window[:got] = chunk
            if not got:
                break
            digest.update(window[:got])
            filled += got
    return data, filled, digest


def verify_all(storage: Storage, ckpt: str) -> Manifest:
    """Read the manifest and check every file's size and digest, reading each once."""
    manifest = read(storage, ckpt)
    for name, entry in manifest.files.items():
        read_verified(storage, ckpt, name, entry)
    return manifest
