"""Final export: model weights as safetensors, only from a checkpoint that passed validation."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from safetensors.torch import save as safetensors_bytes

from .errors import ExportRefusedError
from .reader import CheckpointRef, load

EXPORT_NAME = "model.safetensors"


@dataclass(frozen=True)
class Artifact:
    uri: str
    digest: str  # "sha256:<hex>" of the exported file
    bytes: int


def export_weights(ref: CheckpointRef, dest_key: str | None = None, *, weights: dict | None = None) -> Artifact:
    """Write `ref`'s model weights to `<root>/export/<step dir>/model.safetensors`
    (or `dest_key` in the same storage). Refused unless the checkpoint is recorded valid.
    `weights`: the ones its reader already loaded (a framework's own format); by default
    they are read as Respawn's tensors."""
    verdict = ref.validation()
    if not verdict or verdict.get("result") != "valid":
        state = verdict.get("result") if verdict else "pending"
        raise ExportRefusedError(f"refusing to export {ref.uri}: its validation is {state}, export needs a valid checkpoint")
    if weights is None:
        weights = load(ref).state["model"]
    # Tensors loaded from one data file share its buffer; safetensors wants them separate.
    data = safetensors_bytes({name: t.contiguous().clone() for name, t in weights.items()}, metadata={"step": str(ref.step)})
    key = dest_key or f"export/{ref.name}/{EXPORT_NAME}"
    ref.storage.write_atomic(key, data)
    return Artifact(ref.storage.url_for(key), f"sha256:{hashlib.sha256(data).hexdigest()}", len(data))
