"""Names inside a checkpoint root (DESIGN §6).

    <root>/step-00001200/data-r<rank>-<n>.bin   tensor bytes, one file per writer thread
    <root>/step-00001200/state-rank<r>.json     rank r's state (ranks > 0 of a gang)
    <root>/step-00001200/state.json             step, kind, rng, sampler, scheduler, tensor index
    <root>/step-00001200/MANIFEST.json          every file above: size + digest; written last
    <root>/step-00001200/VALIDATION.json        validation verdict, written after the commit
    <root>/step-00001200/VALIDATING.json        a validator's claim: it is reading this one
    <root>/LATEST                               name of the newest committed checkpoint
"""

from __future__ import annotations

import re

MANIFEST = "MANIFEST.json"
STATE = "state.json"
VALIDATION = "VALIDATION.json"
VALIDATING = "VALIDATING.json"
LATEST = "LATEST"
FORMAT = "respawn-checkpoint/1"

_STEP_DIR = re.compile(r"^step-(\d{8,})$")


def step_dir(step: int) -> str:
    return f"step-{step:08d}"


def parse_step_dir(name: str) -> int | None:
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


def split_uri(uri: str) -> tuple[str, str] | None:
    """`<root>/step-00001200` -> (root, "step-00001200"); None when it names no checkpoint
    directory. Torch-free: the validator claims its checkpoint before importing torch."""
    root, _, name = uri.rstrip("/").rpartition("/")
    return (root, name) if parse_step_dir(name) is not None and root else None


def data_file(rank: int, index: int) -> str:
    return f"data-r{rank}-{index}.bin"


def rank_state_file(rank: int) -> str:
    return STATE if rank == 0 else f"state-rank{rank}.json"
