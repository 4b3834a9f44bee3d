"""`respawn submit --workdir DIR`: the directory as a content-addressed source archive
(agents/respawn/sourcetree.py), uploaded once per team and digest.

The archive is deterministic: entries sorted by path, every mtime 0, owner root with
no names, modes 0644/0755 (0755 where the owner may execute), and a gzip header with
no name or time, so the same tree gives the same bytes and the same digest, and a
second submit of it uploads nothing (the CLI asks the control plane first).

Ignored, as git would: what `.gitignore` files (at any depth, each for its own
directory) and a `.respawnignore` at the top (same syntax, read last so it can also
re-include with `!`) match, and `.git/`. The matching is `pathspec`'s GitIgnoreSpec."""

from __future__ import annotations

import gzip
import os
import posixpath
import stat
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pathspec import GitIgnoreSpec

from respawn.sourcetree import CHUNK_BYTES, DIGEST_PREFIX, MEDIA_TYPE, sha256_of
from respawn.cli.api import Api, FieldErrors
from respawn.cli.errors import EXIT_BAD_INPUT, CliError

IGNORE_FILE = ".respawnignore"
GITIGNORE = ".gitignore"
MAX_BYTES_ENV = "RESPAWN_SOURCE_MAX_BYTES"
DEFAULT_MAX_BYTES = 100 * 1024 * 1024  # the control plane's default too (settings RESPAWN["SOURCE_MAX_BYTES"])


def max_bytes() -> int:
    raw = os.environ.get(MAX_BYTES_ENV, "")
    if not raw:
        return DEFAULT_MAX_BYTES
    if not raw.isdigit() or int(raw) <= 0:
        raise CliError(f"{MAX_BYTES_ENV}={raw!r}: give a number of bytes, e.g. {DEFAULT_MAX_BYTES}", EXIT_BAD_INPUT)
    return int(raw)


@dataclass(frozen=True)
class Archive:
    path: Path  # a temporary file; the caller removes it
    sha256: str
    bytes: int
    files: int
    unpacked_bytes: int

    @property
    def digest(self) -> str:
        return DIGEST_PREFIX + self.sha256


class IgnoreRules:
    """Which paths of the tree stay out: .gitignore files, then .respawnignore, last match wins."""

    def __init__(self, root: Path):
        self.root = root
        self.by_dir: dict[str, GitIgnoreSpec] = {}
        self.respawnignore = self._read(root / IGNORE_FILE)

    def _read(self, path: Path) -> GitIgnoreSpec | None:
        try:
            return GitIgnoreSpec.from_lines(path.read_text(errors="replace").splitlines())
        except FileNotFoundError:
            return None
        except OSError as e:
            raise CliError(f"cannot read {path}: {e.strerror}", EXIT_BAD_INPUT) from e

    def enter(self, rel_dir: str) -> None:
        """Read `rel_dir`'s .gitignore (before its entries are judged)."""
        spec = self._read(self.root / rel_dir / GITIGNORE)
        if spec is not None:
            self.by_dir[rel_dir] = spec

    def ignored(self, rel: str, is_dir: bool) -> bool:
        if rel == ".git" or rel.endswith("/.git"):
            return True
        verdict = None
        for base in ["", *_ancestors(rel)]:
            spec = self.by_dir.get(base)
            if spec is not None:
                verdict = self._judge(spec, posixpath.relpath(rel, base or "."), is_dir, verdict)
        if self.respawnignore is not None:
            verdict = self._judge(self.respawnignore, rel, is_dir, verdict)
        return bool(verdict)

    @staticmethod
    def _judge(spec: GitIgnoreSpec, rel: str, is_dir: bool, verdict: bool | None) -> bool | None:
        include = spec.check_file(rel + "/" if is_dir else rel).include  # True: ignored; False: a `!` re-included it
        return verdict if include is None else include


def _ancestors(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def entries(root: Path) -> list[tuple[str, os.stat_result]]:
    """(relative posix path, lstat) of everything kept, sorted by path; an ignored
    directory is not entered (as in git, nothing under it can be re-included)."""
    rules, found = IgnoreRules(root), []

    def walk(rel_dir: str) -> None:
        rules.enter(rel_dir)
        directory = root / rel_dir
        try:
            names = sorted(os.listdir(directory))
        except OSError as e:
            raise CliError(f"cannot read {directory}: {e.strerror}", EXIT_BAD_INPUT) from e
        for name in names:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            st = os.lstat(root / rel)
            is_dir = stat.S_ISDIR(st.st_mode)
            if rules.ignored(rel, is_dir):
                continue
            found.append((rel, st))
            if is_dir:
                walk(rel)

    walk("")
    return sorted(found, key=lambda entry: entry[0].encode("utf-8", "surrogateescape"))


def build(root: Path, limit: int) -> Archive:
    """The archive of `root`'s kept entries in a temporary file, or CliError when the
    directory is missing, holds something that cannot be shipped, or its files or their
    archive are over `limit` bytes."""
    if not root.is_dir():
        raise CliError(f"--workdir {root}: {'not a directory' if root.exists() else 'no such directory'}; "
                       "nothing was uploaded or submitted", EXIT_BAD_INPUT)
    kept = entries(root)
    unpacked = sum(st.st_size for _, st in kept if stat.S_ISREG(st.st_mode))
    if unpacked > limit:
        biggest = sorted(((st.st_size, rel) for rel, st in kept if stat.S_ISREG(st.st_mode)), reverse=True)[:3]
        raise CliError(f"--workdir {root}: its files add up to {_size(unpacked)}, over the limit of {_size(limit)} "
                       f"({MAX_BYTES_ENV}); nothing was uploaded or submitted. Largest: "
                       + ", ".join(f"{rel} ({_size(size)})" for size, rel in biggest)
                       + f". Leave data out with {IGNORE_FILE} (gitignore syntax)", EXIT_BAD_INPUT)
    fd, name = tempfile.mkstemp(prefix="respawn-source-", suffix=".tar.gz")
    path = Path(name)
    try:
        with os.fdopen(fd, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel, st in kept:
                _add(tar, root, rel, st)
        size = path.stat().st_size
        if size > limit:
            raise CliError(f"--workdir {root}: its archive is {_size(size)}, over the limit of {_size(limit)} "
                           f"({MAX_BYTES_ENV}); nothing was uploaded or submitted", EXIT_BAD_INPUT)
        return Archive(path=path, sha256=sha256_of(path), bytes=size,
                       files=sum(1 for _, st in kept if stat.S_ISREG(st.st_mode)), unpacked_bytes=unpacked)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def _add(tar: tarfile.TarFile, root: Path, rel: str, st: os.stat_result) -> None:
    info = tarfile.TarInfo(rel)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    if stat.S_ISDIR(st.st_mode):
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
    elif stat.S_ISLNK(st.st_mode):
        target = os.readlink(root / rel)
        landing = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
        if target.startswith("/") or landing == ".." or landing.startswith("../"):
            raise CliError(f"--workdir {root}: {rel} is a symbolic link out of the directory (to {target}); "
                           f"it would not be there on the VM: copy what it points to in, or list it in "
                           f"{IGNORE_FILE}", EXIT_BAD_INPUT)
        info.type, info.mode, info.linkname = tarfile.SYMTYPE, 0o777, target
        tar.addfile(info)
    elif stat.S_ISREG(st.st_mode):
        info.size, info.mode = st.st_size, 0o755 if st.st_mode & stat.S_IXUSR else 0o644
        with open(root / rel, "rb") as f:
            tar.addfile(info, f)
    else:
        raise CliError(f"--workdir {root}: {rel} is not a file, directory or symbolic link (a socket, pipe or "
                       f"device); list it in {IGNORE_FILE}", EXIT_BAD_INPUT)


def _size(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 1024 * 1024 else f"{n / (1024 * 1024):.1f} MiB"


class UploadBody:
    """The archive as a request body that draws a progress bar on stderr as it is read,
    when stderr is a terminal (nothing otherwise). Its length lets requests send a
    Content-Length, which the control plane checks against its limit before reading."""

    def __init__(self, archive: Archive, *, stream=None):
        self.archive, self.sent = archive, 0
        self.stream = stream if stream is not None else sys.stderr
        self.show = self.stream.isatty()
        self.file = open(archive.path, "rb")

    def __len__(self) -> int:
        return self.archive.bytes

    def read(self, size: int = -1) -> bytes:
        chunk = self.file.read(CHUNK_BYTES if size is None or size < 0 else size)
        self.sent += len(chunk)
        if self.show:
            self._draw(done=not chunk or self.sent == self.archive.bytes)
        return chunk

    def _draw(self, done: bool) -> None:
        total = max(self.archive.bytes, 1)
        width = 30
        filled = width * self.sent // total
        self.stream.write(f"\ruploading {self.archive.digest[:19]}… [{'#' * filled}{' ' * (width - filled)}] "
                          f"{100 * self.sent // total:3d}% {_size(self.sent)} of {_size(self.archive.bytes)}")
        if done:
            self.stream.write("\n")
            self.show = False  # requests may read once more at the end
        self.stream.flush()

    def close(self) -> None:
        self.file.close()


def ship(client: Api, archive: Archive, team: int) -> None:
    """Upload `archive` to `team` unless it has these bytes already (asked first), or
    CliError when they are over the control plane's own limit (nothing is sent then)."""
    path = f"sources/{archive.digest}/"
    known = client.get(path, team=team)
    if known["stored"]:
        print(f"source {archive.digest} is already uploaded; not sending it again", file=sys.stderr)
        return
    if max(archive.bytes, archive.unpacked_bytes) > known["max_bytes"]:
        raise CliError(f"the source archive ({_size(archive.bytes)}; its files {_size(archive.unpacked_bytes)}) is over "
                       f"the control plane's limit of {_size(known['max_bytes'])}; nothing was uploaded or submitted",
                       EXIT_BAD_INPUT)
    body = UploadBody(archive)
    try:
        client.request("PUT", path, params={"team": team}, data=body, headers={"Content-Type": MEDIA_TYPE})
    except FieldErrors as e:
        raise CliError("the control plane refused the source archive; nothing was submitted", EXIT_BAD_INPUT,
                       [f"{name}: {' '.join(map(str, msgs))}" for name, msgs in e.errors.items()]) from e
    finally:
        body.close()
    print(f"uploaded {archive.files} files ({_size(archive.bytes)}) as {archive.digest}", file=sys.stderr)
