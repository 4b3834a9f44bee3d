"""Source archives for tests: a working directory like a user's, and hand-made tar files
holding what the CLI never writes (the hostile ones a tampered upload or storage could)."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

from respawn.sourcetree import sha256_of

TRAIN_SCRIPT = """\
import json, os
from helper import greeting

print(greeting(), "from", os.getcwd())
status = os.environ["RESPAWN_STATUS_FILE"]
with open(status + ".tmp", "w") as f:
    json.dump({"step": 3}, f)
os.replace(status + ".tmp", status)
"""


def user_workdir(root: Path) -> Path:
    """A training script, a module it imports, data .gitignore leaves out, a symlink within."""
    (root / "configs").mkdir(parents=True)
    (root / "train.py").write_text(TRAIN_SCRIPT)
    (root / "helper.py").write_text("def greeting():\n    return 'hello from the uploaded workdir'\n")
    (root / "configs" / "base.yaml").write_text("lr: 0.1\n")
    (root / "configs" / "current.yaml").symlink_to("base.yaml")
    (root / "data").mkdir()
    (root / "data" / "shard-0.bin").write_bytes(b"\0" * 4096)
    (root / ".gitignore").write_text("data/\n__pycache__/\n")
    return root


def hostile_tar(path: Path, *entries: tuple[str, str, bytes | str]) -> str:
    """A .tar.gz of (name, kind, payload) entries, kind one of file, dir, symlink, hardlink,
    device, fifo, sparse (payload: the bytes, or the link target); its hex SHA-256."""
    kinds = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
             "hardlink": tarfile.LNKTYPE, "device": tarfile.CHRTYPE, "fifo": tarfile.FIFOTYPE,
             "sparse": tarfile.GNUTYPE_SPARSE}
    with tarfile.open(path, "w:gz") as tar:
        for name, kind, payload in entries:
            info = tarfile.TarInfo(name)
            info.type, info.mode = kinds[kind], 0o755 if kind == "dir" else 0o644
            if kind in ("symlink", "hardlink"):
                info.linkname = payload
                tar.addfile(info)
            elif kind == "file":
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
            else:
                tar.addfile(info)
    return sha256_of(path)


def header_bomb(path: Path, header_bytes: int, *, kind: bytes = tarfile.XHDTYPE, headers: int = 1) -> str:
    """A .tar.gz of `headers` extended headers of `header_bytes` each (a pax `comment`, or a
    GNU long name), then a small train.py: tiny compressed, huge for whoever reads the headers
    whole. Written a block at a time, so making one costs the test no memory; its hex SHA-256."""
    with gzip.open(path, "wb") as out:
        for _ in range(headers):
            gnu = kind == tarfile.GNUTYPE_LONGNAME
            info = tarfile.TarInfo("././@LongLink" if gnu else "././@PaxHeader")
            info.type, info.size = kind, header_bytes
            out.write(info.tobuf(tarfile.GNU_FORMAT if gnu else tarfile.USTAR_FORMAT))
            start = b"a" if gnu else f"{header_bytes} comment=".encode()  # then x..., then a newline
            out.write(start)
            for left in range(header_bytes - len(start) - 1, 0, -len(BLOCK_OF_X)):
                out.write(BLOCK_OF_X[:left])
            out.write(b"\n" + b"\0" * (-header_bytes % tarfile.BLOCKSIZE))
        script = tarfile.TarInfo("train.py")
        script.size = 9
        out.write(script.tobuf(tarfile.USTAR_FORMAT) + b"print(1)\n".ljust(tarfile.BLOCKSIZE, b"\0"))
        out.write(b"\0" * 2 * tarfile.BLOCKSIZE)
    return sha256_of(path)


BLOCK_OF_X = b"x" * (1 << 20)
