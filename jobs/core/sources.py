"""Jobs' source archives on the control plane (DESIGN §11): stored once per SHA-256
under RESPAWN["SOURCE_DIR"], recorded per team (models.SourceArchive), served to a
job's VMs on the agent API (`GET source`), which check the digest the job spec pins.

An upload is read to a temporary file while its SHA-256 is computed, refused unless
that is the digest it was sent under, then unpacked into a scratch directory with the
agent's own `respawn.sourcetree.unpack` (so an archive a VM could not unpack safely is
refused here, naming the member), and only then moved into place: a stored file is
always whole and always the bytes its name says."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction

from respawn.sourcetree import CHUNK_BYTES, BadArchive, unpack
from respawn_server.jobs.models import SourceArchive


class UploadRefused(ValueError):
    """An upload that is not stored; `field` names what was wrong (digest, archive)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


class TooLarge(UploadRefused):
    pass


def max_bytes() -> int:
    return settings.RESPAWN["SOURCE_MAX_BYTES"]


def stored_path(sha256: str) -> Path:
    return Path(settings.RESPAWN["SOURCE_DIR"]) / "sha256" / sha256[:2] / f"{sha256}.tar.gz"


def find(team_id: int, sha256: str) -> SourceArchive | None:
    return SourceArchive.objects.filter(team_id=team_id, sha256=sha256).first()


def store(team_id: int, user, sha256: str, stream, length: int) -> tuple[SourceArchive, bool]:
    """The team's archive with this digest, read from `stream` (`length` bytes) unless the
    team has it already; True when it was new. UploadRefused (TooLarge) otherwise. Even
    when another team stored the same bytes, they are read and checked: a digest alone
    proves nothing about holding the code."""
    known = find(team_id, sha256)
    if known is not None:
        return known, False
    limit = max_bytes()
    if length > limit:
        raise TooLarge("archive", f"the archive is {length} bytes, over this control plane's limit of {limit}")
    scratch = Path(settings.RESPAWN["SOURCE_DIR"]) / "incoming"
    scratch.mkdir(parents=True, exist_ok=True, mode=0o700)
    with tempfile.TemporaryDirectory(dir=scratch) as work:
        received = Path(work) / "archive.tar.gz"
        _receive(stream, length, received, sha256)
        try:
            contents = unpack(received, Path(work) / "tree", max_unpacked_bytes=limit)
        except BadArchive as exc:
            raise UploadRefused("archive", f"refused: {exc}") from exc
        finally:
            shutil.rmtree(Path(work) / "tree", ignore_errors=True)
        final = stored_path(sha256)
        final.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.replace(received, final)  # the same bytes if another upload got there first
    try:
        with transaction.atomic():
            return SourceArchive.objects.create(team_id=team_id, sha256=sha256, bytes=length, files=contents.files,
                                                unpacked_bytes=contents.unpacked_bytes, uploaded_by=user), True
    except IntegrityError:  # the same team's concurrent upload of the same tree
        return find(team_id, sha256), False


def _receive(stream, length: int, path: Path, sha256: str) -> None:
    digest, got = hashlib.sha256(), 0
    with open(path, "wb") as f:
        while got < length:
            chunk = stream.read(min(CHUNK_BYTES, length - got))
            if not chunk:
                break
            digest.update(chunk)
            f.write(chunk)
            got += len(chunk)
    if got != length:
        raise UploadRefused("archive", f"the body ended after {got} of its {length} bytes")
    if digest.hexdigest() != sha256:
        raise UploadRefused("digest", f"the body's SHA-256 is {digest.hexdigest()}, not the digest it was sent as "
                                      f"({sha256}): it changed on the way, or the digest is of something else")
