"""Stand-ins for a user's prepare, training and post commands (no torch: they start in
a blink). Each appends to a file named by the job's env, so a test can count runs.

    python -m tests.steps.programs prepare        # writes $RESPAWN_PREPARE_DIR/vocab.txt
    python -m tests.steps.programs train          # 1st run: waits to be stopped; later: exports an artifact
    python -m tests.steps.programs post [--fail]  # checks the artifact it is given
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path


def _count(name: str) -> int:
    """Append a line to the counter file $STEPS_<NAME>_COUNTER; returns how many runs came before."""
    path = Path(os.environ[f"STEPS_{name.upper()}_COUNTER"])
    before = len(path.read_text().splitlines()) if path.exists() else 0
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")
    return before


def _status(**fields) -> None:
    path = os.environ["RESPAWN_STATUS_FILE"]
    with open(f"{path}.tmp", "w") as f:
        json.dump(fields, f)
    os.replace(f"{path}.tmp", path)


def prepare() -> int:
    _count("prepare")
    Path(os.environ["RESPAWN_PREPARE_DIR"], "vocab.txt").write_text(os.environ.get("STEPS_VOCAB", "prepared vocab"))
    print("prepared the vocabulary")
    return 0


def train() -> int:
    vocab = Path(os.environ["RESPAWN_PREPARE_DIR"], "vocab.txt").read_text()
    print(f"trainer read {vocab!r} from {os.environ['RESPAWN_PREPARE_DIR']} ({os.environ['RESPAWN_PREPARE_URI']})")
    if _count("train") == 0:
        _status(step=1)
        time.sleep(120)  # the first VM is preempted meanwhile (SIGTERM ends this process)
        return 1
    export = Path(os.environ["RESPAWN_CHECKPOINT_URI"], "export", "model.bin")
    export.parent.mkdir(parents=True, exist_ok=True)
    export.write_bytes(b"weights " + vocab.encode())
    digest = "sha256:" + hashlib.sha256(export.read_bytes()).hexdigest()
    _status(step=10, artifact_uri=str(export), artifact_digest=digest)
    return 0


def post(fail: bool) -> int:
    _count("post")
    uri, digest = os.environ["RESPAWN_ARTIFACT_URI"], os.environ["RESPAWN_ARTIFACT_DIGEST"]
    actual = "sha256:" + hashlib.sha256(Path(uri).read_bytes()).hexdigest()
    print(f"post step evaluates {uri}: digest {'verified' if actual == digest else 'MISMATCH'}")
    if fail:
        raise ValueError("evaluation set is empty")
    return 0


if __name__ == "__main__":
    step = sys.argv[1]
    sys.exit(prepare() if step == "prepare" else train() if step == "train" else post("--fail" in sys.argv))
