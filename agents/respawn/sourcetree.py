"""A job's source archive (DESIGN §11): a gzip'd tar of a working directory, named by
the SHA-256 of its bytes ("sha256:<hex>").

The CLI builds it (agents/respawn/cli/workdir.py); the control plane checks it at upload by
unpacking it here, and the agent unpacks it on the VM, after checking the digest the
job spec pins, with the same `unpack`: what the server accepted is what a VM can
unpack. Only regular files, directories and symbolic links that stay inside the tree
are unpacked; anything else (an absolute path, a `..`, a link out, a device, a hard
link) refuses the whole archive, naming the member.

Bytes are bounded before `tarfile` parses them, since it reads a pax or GNU long-name
header whole, and copies pax records into every later member: each header's announced
size, the pax records a member carries, and the length of the decompressed stream (a
small multiple of the unpacked limit) are checked as tarfile goes, so a hostile archive
costs a few times its limit in memory and time, never its compression ratio."""

from __future__ import annotations

import gzip
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
# A pax or GNU long-name header, read whole by tarfile: room for a name of MAX_NAME_CHARS
# and a few more records, never megabytes.
MAX_HEADER_BYTES = 64 * 1024
MAX_PAX_RECORDS = 64  # per member, global ones included
# The decompressed stream may be this many times the unpacked limit, plus the slack, long:
# room for every member's header and padding; beyond it, only headers could be spending it.
STREAM_FACTOR = 4
STREAM_SLACK_BYTES = 1 << 20


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
    cap = None if max_unpacked_bytes is None else STREAM_FACTOR * max_unpacked_bytes + STREAM_SLACK_BYTES
    try:
        with open(archive, "rb") as raw, gzip.GzipFile(fileobj=raw) as stream, \
                tarfile.open(fileobj=_Capped(stream, cap), mode="r:", tarinfo=_BoundedTarInfo) as tar:
            members, contents = _checked_members(tar, max_unpacked_bytes)
            dest.mkdir(mode=0o755)
            tar.extractall(dest, members=members, filter="data")
    except tarfile.FilterError as exc:  # tarfile's own refusal of a member (a link out, say)
        raise BadArchive(str(exc)) from exc
    except (tarfile.TarError, EOFError, zlib.error, UnicodeError, gzip.BadGzipFile) as exc:
        raise BadArchive(f"not a gzip'd tar archive: {exc}") from exc
    _links_stay_inside(dest)
    return contents


class _Capped:
    """The decompressed stream as tarfile reads and seeks it, refused once past `cap` bytes."""

    def __init__(self, stream: gzip.GzipFile, cap: int | None):
        self.stream, self.cap = stream, cap

    def read(self, size: int = -1) -> bytes:
        if self.cap is not None:
            room = self.cap + 1 - self.stream.tell()  # one byte past the cap says there is more
            size = room if size is None or size < 0 else min(size, room)
        data = self.stream.read(size)
        self._within()
        return data

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if self.cap is not None and whence == os.SEEK_SET and offset > self.cap:
            self._refuse()
        self.stream.seek(offset, whence)
        self._within()
        return self.stream.tell()

    def tell(self) -> int:
        return self.stream.tell()

    def _within(self) -> None:
        if self.cap is not None and self.stream.tell() > self.cap:
            self._refuse()

    def _refuse(self):
        raise BadArchive(f"it decompresses to more than {self.cap} bytes ({STREAM_FACTOR} times the limit, and "
                         f"{STREAM_SLACK_BYTES} for headers)")


class _BoundedTarInfo(tarfile.TarInfo):
    """tarfile's own header parsing, refusing a header before tarfile reads what it announces:
    an extended header over MAX_HEADER_BYTES, a sparse file's maps (read block by block
    without end), a member with more than MAX_PAX_RECORDS pax records."""

    def _proc_member(self, tarfile_):
        if self.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
                         tarfile.SOLARIS_XHDTYPE) and self.size > MAX_HEADER_BYTES:
            raise BadArchive(f"a header of {self.size} bytes (pax or GNU long name); at most {MAX_HEADER_BYTES} "
                             "are read")
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise _sparse(self)
        member = super()._proc_member(tarfile_)
        if len(member.pax_headers) > MAX_PAX_RECORDS:
            raise BadArchive(f"{member.name[:200]!r}: {len(member.pax_headers)} pax records; at most "
                             f"{MAX_PAX_RECORDS} are read")
        return member

    def _proc_gnusparse_10(self, next, pax_headers, tarfile_):  # a pax-format sparse file's map
        raise _sparse(next)


def _sparse(member: tarfile.TarInfo) -> BadArchive:
    return BadArchive(f"{member.name[:200]!r}: a sparse file; only files, directories and symbolic links are unpacked")


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
