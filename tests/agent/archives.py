"""Source archives for tests: a working directory like a user's, and hand-made tar files
holding what the CLI never writes (the hostile ones a tampered upload or storage could)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from agents.sourcetree import sha256_of

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
    device, fifo (payload: the bytes, or the link target); its hex SHA-256."""
    kinds = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
             "hardlink": tarfile.LNKTYPE, "device": tarfile.CHRTYPE, "fifo": tarfile.FIFOTYPE}
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
