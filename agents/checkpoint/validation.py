"""Validation (DESIGN §6): does a checkpoint's model reproduce the loss it had when saved?

The user names two factories, `module:function` each: one returns a fresh
`nn.Module`, the other the fixed-seed validation batch `(inputs, targets)`.
The loss is cross-entropy when the targets are integers, mean squared error
otherwise. At save time the reference loss is computed from the snapshot without
disturbing training (see ReferenceLoss), so exact resume holds with validation on.
"""

from __future__ import annotations

import importlib
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
import torch
import torch.nn.functional as F

from . import layout
from .errors import FactoryError, IncompatibleCheckpointError
from .reader import CheckpointRef, LoadedCheckpoint, load


@dataclass(frozen=True)
class ValidationSettings:
    model_factory: str
    batch_factory: str
    tolerance: float = 1e-4

    def __post_init__(self):
        for name in ("model_factory", "batch_factory"):
            value = getattr(self, name)
            if value.count(":") != 1 or not all(value.split(":")):
                raise FactoryError(f"{name} {value!r} must look like 'package.module:function'")
        if not self.tolerance >= 0:
            raise FactoryError(f"validation tolerance must be >= 0, got {self.tolerance}")

    def to_json(self) -> dict:
        return {"model_factory": self.model_factory, "batch_factory": self.batch_factory, "tolerance": self.tolerance}


@dataclass(frozen=True)
class Verdict:
    valid: bool
    loss: float | None
    reference_loss: float | None
    message: str = ""

    @property
    def result(self) -> str:
        return "valid" if self.valid else "invalid"

    def to_json(self) -> dict:
        return {"result": self.result, "loss": self.loss, "reference_loss": self.reference_loss, "message": self.message}


def resolve(spec: str) -> Callable:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise FactoryError(f"cannot import module {module_name!r} of factory {spec!r}: {exc}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise FactoryError(f"module {module_name!r} has no {attr!r} (factory {spec!r})") from None


def _call(spec: str):
    try:
        return resolve(spec)()
    except FactoryError:
        raise
    except Exception as exc:
        raise FactoryError(f"factory {spec!r} raised {type(exc).__name__}: {exc}") from exc


def batch_loss(model: torch.nn.Module, batch) -> float:
    inputs, targets = batch
    device = next(model.parameters()).device
    output = model(inputs.to(device))
    targets = targets.to(device)
    if targets.dtype in (torch.int64, torch.int32, torch.int16, torch.uint8):
        return float(F.cross_entropy(output, targets))
    return float(F.mse_loss(output, targets))


class ReferenceLoss:
    """The reference loss of a snapshot, computed off the training thread.

    The batch and a weightless (meta-device) model are built once, on the training
    thread with every RNG forked, because a factory may seed the global RNG; after
    that, each save only points the model at the snapshot's weight buffers
    (`assign=True`, no copy) and runs an eval-mode, no_grad forward in the persist
    thread, which touches no RNG. Training neither stalls for it nor sees it.
    """

    def __init__(self, settings: ValidationSettings):
        self.settings = settings
        self._batch = None
        self._model: torch.nn.Module | None = None

    def prepare(self) -> None:
        """Build the batch and model skeleton (training thread, first save only)."""
        if self._model is not None:
            return
        with _rng_untouched():
            self._batch = _call(self.settings.batch_factory)
        self._model = model_skeleton(self.settings.model_factory).eval()

    def loss(self, weights: dict[str, torch.Tensor]) -> float:
        load_model_weights(self._model, weights, "the snapshot", assign=True)
        if has_meta_state(self._model):
            raise FactoryError(f"model factory {self.settings.model_factory!r}: the model has state outside its state_dict")
        with torch.no_grad():
            return batch_loss(self._model, self._batch)


def model_skeleton(model_factory: str) -> torch.nn.Module:
    """The factory's model without memory or initialisation for its weights (meta
    device; every RNG forked, since a factory may seed): loaded weights are then
    assigned, not copied over freshly initialised ones."""
    with _rng_untouched(), torch.device("meta"):
        model = _call(model_factory)
    if not isinstance(model, torch.nn.Module):
        raise FactoryError(f"model factory {model_factory!r} returned {type(model).__name__}, not an nn.Module")
    return model


def has_meta_state(model: torch.nn.Module) -> bool:
    return any(t.is_meta for t in (*model.parameters(), *model.buffers()))


class _rng_untouched:
    """Python, numpy and torch CPU/CUDA RNG states restored on exit."""

    def __enter__(self):
        self._py, self._np = random.getstate(), np.random.get_state()
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
        self._torch = torch.random.fork_rng(devices=devices)
        self._torch.__enter__()

    def __exit__(self, *exc):
        self._torch.__exit__(*exc)
        random.setstate(self._py)
        np.random.set_state(self._np)


def _close_enough(loss: float, reference: float, tolerance: float) -> bool:
    if math.isnan(loss) or math.isnan(reference):
        return False
    return abs(loss - reference) <= tolerance * max(1.0, abs(reference))


def validate(ref: CheckpointRef, settings: ValidationSettings | None = None, record: bool = True) -> Verdict:
    """Reload `ref` into a fresh model and compare its loss with the stored reference.

    Corrupt checkpoints raise CorruptCheckpointError, a model that does not fit
    IncompatibleCheckpointError, an unusable factory FactoryError; a loss mismatch
    returns an invalid Verdict. The verdict is recorded in VALIDATION.json when `record`."""
    verdict = validate_loaded(load(ref), settings)
    if record:
        mark(ref, verdict)
    return verdict


def validate_loaded(loaded: LoadedCheckpoint, settings: ValidationSettings | None = None) -> Verdict:
    uri = loaded.ref.uri
    if settings is None:
        stored = loaded.meta.get("validation")
        if not stored:
            raise FactoryError(f"checkpoint {uri} names no validation factories; pass them explicitly")
        settings = ValidationSettings(**stored)
    model = model_skeleton(settings.model_factory)
    load_model_weights(model, loaded.state["model"], uri, assign=True)
    if has_meta_state(model):  # as at save time (ReferenceLoss): the checkpoint cannot hold all of it
        raise FactoryError(f"model factory {settings.model_factory!r}: the model has state outside its state_dict")
    with torch.no_grad():
        model.eval()
        loss = batch_loss(model, _call(settings.batch_factory))
    reference = loaded.meta.get("reference_loss")
    if reference is None:
        return Verdict(False, loss, None, f"checkpoint {uri} stores no reference loss")
    if _close_enough(loss, reference, settings.tolerance):
        return Verdict(True, loss, reference)
    return Verdict(False, loss, reference, f"checkpoint {uri}: loss {loss!r} differs from reference {reference!r} beyond tolerance {settings.tolerance}")


def mark(ref: CheckpointRef, verdict: Verdict) -> None:
    body = verdict.to_json() | {"validated_at": datetime.now(timezone.utc).isoformat()}
    ref.storage.write_atomic(ref.key(layout.VALIDATION), json.dumps(body).encode())


def load_model_weights(model: torch.nn.Module, weights: dict, where: str, assign: bool = False) -> None:
    """`model.load_state_dict` with errors that name the checkpoint."""
    expected = model.state_dict()
    for name, tensor in weights.items():
        if name in expected and tuple(expected[name].shape) != tuple(tensor.shape):
            raise IncompatibleCheckpointError(
                f"checkpoint {where}: {name} has shape {tuple(tensor.shape)}, the model expects {tuple(expected[name].shape)} (a checkpoint of another model?)")
    try:
        model.load_state_dict(weights, assign=assign)
    except RuntimeError as exc:
        raise IncompatibleCheckpointError(f"checkpoint {where} does not fit the model: {exc}") from None
