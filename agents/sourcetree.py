"""A job's source archive (DESIGN §11): a gzip'd tar of a working directory, named by
the SHA-256 of its bytes ("sha256:<hex>").

The CLI builds it (respawncli/workdir.py); the control plane checks it at upload by
unpacking it here, and the agent unpacks it on the VM, after checking the digest the
job spec pins, with the same `unpack`: what the server accepted is what a VM can
unpack. Only regular files, directories and symbolic links that stay inside the tree
are unpacked; anything else (an absolute path, a `..`, a link out, a device, a hard
link) refuses the whole archive, naming the member."""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

DIGEST_PREFIX = "sha256:"
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
MEDIA_TYPE = "application/gzip"
# Bounds on what one member may say, well above any real tree's: a name of thousands of
# characters is how tarfile's own link check was once walked past (CVE-2025-4517).
MAX_NAME_CHARS = 1024
MAX_MEMBERS = 200_000
CHUNK_BYTES = 1 << 20


class BadArchive(ValueError):
    """The archive cannot be unpacked safely, or is no gzip'd tar; the message says which
    member and why."""


@dataclass(frozen=True)
class Contents:
    files: int
    unpacked_bytes: int


def sha256_of(path: str | os.PathLike) -> str:
    """The hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def unpack(archive: str | os.PathLike, dest: str | os.PathLike, *, max_unpacked_bytes: int | None = None) -> Contents:
    """Unpack `archive` into the directory `dest` (made here; it must not exist yet), or
    BadArchive. `max_unpacked_bytes` bounds the files' total size (the control plane's
    limit at upload; the agent unpacks only bytes whose digest that check pinned)."""
    dest = Path(dest)
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            members, contents = _checked_members(tar, max_unpacked_bytes)
            dest.mkdir(mode=0o755)
            tar.extractall(dest, members=members, filter="data")
    except tarfile.FilterError as exc:  # tarfile's own refusal of a member (a link out, say)
        raise BadArchive(str(exc)) from exc
    except (tarfile.TarError, EOFError, zlib.error, UnicodeError) as exc:
        raise BadArchive(f"not a gzip'd tar archive: {exc}") from exc
    _links_stay_inside(dest)
    return contents


def _checked_members(tar: tarfile.TarFile, max_unpacked_bytes: int | None) -> tuple[list[tarfile.TarInfo], Contents]:
    members, names, links, files, total = [], set(), set(), 0, 0
    for member in tar:
        if len(members) >= MAX_MEMBERS:
            raise BadArchive(f"more than {MAX_MEMBERS} entries")
        name = posixpath.normpath(member.name)
        shown = repr(member.name[:200])
        if len(member.name) > MAX_NAME_CHARS or len(member.linkname) > MAX_NAME_CHARS:
            raise BadArchive(f"{shown}: a name or link target longer than {MAX_NAME_CHARS} characters")
        if member.name.startswith("/") or ".." in name.split("/") or name == ".":
            raise BadArchive(f"{shown}: an absolute path or one with '..' (it would land outside the directory)")
        if not (member.isreg() or member.isdir() or member.issym()):
            raise BadArchive(f"{shown}: {_kind(member)}; only files, directories and symbolic links are unpacked")
        if name in names:
            raise BadArchive(f"{shown}: given twice")
        through = next((p for p in _parents(name) if p in links), None)
        if through is not None:
            raise BadArchive(f"{shown}: inside the symbolic link {through!r} (it would be written wherever that points)")
        if member.issym():
            links.add(name)
        names.add(name)
        if member.isreg():
            files += 1
            total += member.size
            if max_unpacked_bytes is not None and total > max_unpacked_bytes:
                raise BadArchive(f"its files add up to more than the limit of {max_unpacked_bytes} bytes")
        members.append(member)
    return members, Contents(files=files, unpacked_bytes=total)


def _parents(name: str) -> list[str]:
    parts = name.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _kind(member: tarfile.TarInfo) -> str:
    if member.islnk():
        return "a hard link"
    if member.ischr() or member.isblk():
        return "a device file"
    if member.isfifo():
        return "a named pipe"
    return f"an entry of type {member.type!r}"


def _links_stay_inside(dest: Path) -> None:
    """Every symbolic link unpacked resolves inside `dest` (tarfile's filter checked each
    as it went; this looks again at the whole tree, as the trainer will see it)."""
    root = os.path.realpath(dest)
    for directory, dirnames, filenames in os.walk(dest):
        for name in dirnames + filenames:
            path = os.path.join(directory, name)
            if os.path.islink(path) and os.path.commonpath([root, os.path.realpath(path)]) != root:
                raise BadArchive(f"{os.path.relpath(path, dest)!r}: a symbolic link that leads outside the directory")
