"""Validation (DESIGN §6): does a checkpoint's model reproduce the loss it had when saved?

The user names two factories, `module:function` each: one returns a fresh
`nn.Module`, the other the fixed-seed validation batch, and optionally an
`eval_fn(model, batch) -> float` (also `module:function`). Without one, the
default loss (`default_loss`) covers classifiers, regression, causal LMs and
models that compute their own loss. At save time the reference loss is computed
from the snapshot without disturbing training (see ReferenceLoss), so exact
resume holds with validation on.

A verdict is `valid`, `invalid` (the loss differs from the reference) or `error`:
the check itself failed (the eval_fn raised or returned a non-finite number, the
reference could not be computed at save). An `error` condemns nothing: the
checkpoint is neither resumed past nor rotated away as invalid.
"""

from __future__ import annotations

import importlib
import json
import math
import random
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone

import numpy as np
import torch
import torch.nn.functional as F

from . import layout
from .errors import CheckpointError, CorruptCheckpointError, EvalError, FactoryError, IncompatibleCheckpointError
from .reader import CheckpointRef, LoadedCheckpoint, load
from .storage import rewrite_beside


@dataclass(frozen=True)
class ValidationSettings:
    model_factory: str
    batch_factory: str
    tolerance: float = 1e-4
    eval_fn: str = ""  # module:function, eval_fn(model, batch) -> float; empty: default_loss

    def __post_init__(self):
        for name in ("model_factory", "batch_factory", "eval_fn"):
            value = getattr(self, name)
            if (value or name != "eval_fn") and (value.count(":") != 1 or not all(value.split(":"))):
                raise FactoryError(f"{name} {value!r} must look like 'package.module:function'")
        if not self.tolerance >= 0:
            raise FactoryError(f"validation tolerance must be >= 0, got {self.tolerance}")

    def to_json(self) -> dict:
        return {"model_factory": self.model_factory, "batch_factory": self.batch_factory, "tolerance": self.tolerance,
                "eval_fn": self.eval_fn}


@dataclass(frozen=True)
class Verdict:
    valid: bool
    loss: float | None
    reference_loss: float | None
    message: str = ""
    error: bool = False  # the check itself failed: neither valid nor invalid

    @classmethod
    def failed_check(cls, exc: Exception, reference_loss: float | None = None) -> "Verdict":
        return cls(False, None, reference_loss, str(exc), error=True)

    @property
    def result(self) -> str:
        return "error" if self.error else "valid" if self.valid else "invalid"

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


_INTEGER = (torch.int64, torch.int32, torch.int16, torch.uint8)
IGNORE_INDEX = -100  # label positions not scored (padding), as Hugging Face models and F.cross_entropy use it


def default_loss(model: torch.nn.Module, batch) -> float:
    """The loss of `batch` under `model`, for the common shapes of training code:

    - a batch is `(inputs, targets)` (inputs a tensor, or a dict passed as keyword
      arguments) or a dict passed as keyword arguments (`model(**batch)`), whose
      targets are its `labels`, else its `input_ids` (a causal LM scores its input);
    - the output is a tensor, a tuple (its first element), a dict or a ModelOutput:
      its own `loss` when it has one, else its `logits`;
    - integer targets: cross-entropy; `[B, T, V]` logits with `[B, T]` targets are a
      causal LM's, scored shifted (position t predicts token t+1), label -100 ignored;
      floating targets: mean squared error.
    Anything else needs an eval_fn."""
    with torch.no_grad():
        return _default_loss(model, batch)


def _default_loss(model: torch.nn.Module, batch) -> float:
    if isinstance(batch, Mapping):
        output, targets = model(**batch), batch.get("labels", batch.get("input_ids"))
    else:
        inputs, targets = batch
        output = model(**inputs) if isinstance(inputs, Mapping) else model(inputs)
    own_loss, logits = _loss_and_logits(output)
    if own_loss is not None:
        return float(own_loss)
    if targets is None:
        raise EvalError("the batch gives no targets (no labels or input_ids) and the model's output no loss")
    if targets.dtype not in _INTEGER:
        return float(F.mse_loss(logits, targets))
    if logits.dim() == 3 and targets.dim() == 2:
        logits, targets = logits[:, :-1], targets[:, 1:]
    return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX))


def _loss_and_logits(output) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    if isinstance(output, torch.Tensor):
        return None, output
    if isinstance(output, Mapping):  # a dict, or a ModelOutput (an OrderedDict without its None fields)
        return output.get("loss"), output.get("logits")
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return None, output[0]
    raise EvalError(f"the default loss cannot read a model output of type {type(output).__name__}: give an eval_fn")


def evaluate(settings: ValidationSettings, model: torch.nn.Module, batch) -> float:
    """The settings' eval_fn (or default_loss) on `batch`, in eval mode without grad;
    EvalError naming the function when it raises or gives no finite number."""
    fn, name = (resolve(settings.eval_fn), f"eval_fn {settings.eval_fn!r}") if settings.eval_fn else (default_loss, "the default loss")
    try:
        with torch.no_grad():
            value = fn(model, batch)
        value = float(value)
    except EvalError as exc:
        raise EvalError(f"{name}: {exc}") from exc
    except Exception as exc:
        raise EvalError(f"{name} raised {type(exc).__name__}: {exc}") from exc
    if not math.isfinite(value):
        raise EvalError(f"{name} returned {value}, not a finite number")
    return value


def training_device() -> torch.device:
    """Where the separate validation process runs its check: the training GPU when there is one."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def to_device(batch, device: torch.device):
    """`batch` with every tensor in it (nested in dicts, tuples, lists) moved to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}  # a BatchEncoding too: it goes in as **kwargs
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


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
        return evaluate(self.settings, self._model, self._batch)

    def record(self, meta: dict, weights: Callable[[], dict[str, torch.Tensor]]) -> None:
        """The loss of `weights()` as `reference_loss` in a save's state.json body `meta`,
        else `reference_error` saying why there is none: the checkpoint still commits (a
        failing eval_fn must not stop saves); its validation then ends in `error` naming
        this, and condemns nothing."""
        try:
            meta["reference_loss"] = self.loss(weights())
        except Exception as exc:
            meta["reference_error"] = str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"
            print(f"respawn checkpoint: reference loss of step {meta['step']} failed: {meta['reference_error']}",
                  file=sys.stderr, flush=True)


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


def validate(ref: CheckpointRef, settings: ValidationSettings | None = None, record: bool = True,
             device: str | torch.device | None = None) -> Verdict:
    """Reload `ref` into a fresh model and compare its loss with the stored reference.

    Corrupt checkpoints raise CorruptCheckpointError, a model that does not fit
    IncompatibleCheckpointError; a loss mismatch returns an invalid Verdict, a check
    that could not run (unusable factory, failing eval_fn) an `error` one. The verdict
    is recorded in VALIDATION.json when `record`."""
    verdict = judge(load(ref), settings, device)
    if record:
        mark(ref, verdict)
    return verdict


def judge(loaded: LoadedCheckpoint, settings: ValidationSettings | None = None,
          device: str | torch.device | None = None) -> Verdict:
    """validate_loaded, with a check that could not run as an `error` verdict naming why."""
    return judge_weights(loaded.ref.uri, loaded.state["model"], loaded.meta, settings, device)


def validate_loaded(loaded: LoadedCheckpoint, settings: ValidationSettings | None = None,
                    device: str | torch.device | None = None) -> Verdict:
    """The verdict on `loaded` with `settings` (default: the ones stored at save; an
    eval_fn stored there is used when `settings` names none), the model and batch on
    `device` (default CPU). FactoryError/EvalError when the check cannot run."""
    return validate_weights(loaded.ref.uri, loaded.state["model"], loaded.meta, settings, device)


def judge_weights(where: str, weights: dict, meta: dict, settings: ValidationSettings | None = None,
                  device: str | torch.device | None = None) -> Verdict:
    """validate_weights, with a check that could not run as an `error` verdict naming why."""
    try:
        return validate_weights(where, weights, meta, settings, device)
    except (FactoryError, EvalError) as exc:
        return Verdict.failed_check(exc, meta.get("reference_loss"))


def validate_weights(where: str, weights: dict, meta: dict, settings: ValidationSettings | None = None,
                     device: str | torch.device | None = None) -> Verdict:
    """The verdict on a model's `weights` saved with `meta` (a checkpoint's state.json body,
    or a memory-tier replica's rank 0 state): reloaded into a fresh model, its loss against
    the reference loss computed from the same bytes at save."""
    settings = settings_for(where, meta, settings)
    model = model_skeleton(settings.model_factory)
    load_model_weights(model, weights, where, assign=True)
    if has_meta_state(model):  # as at save time (ReferenceLoss): the checkpoint cannot hold all of it
        raise FactoryError(f"model factory {settings.model_factory!r}: the model has state outside its state_dict")
    model.eval()
    batch = _call(settings.batch_factory)
    if device is not None:
        device = torch.device(device)
        if device.type == "cuda":
            # Full float32: the reference loss was computed on the CPU from the snapshot, and
            # TF32 convolutions (cuDNN's default) alone differ from it by more than the tolerance.
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        model, batch = model.to(device), to_device(batch, device)
    reference = reference_loss(where, meta)  # first: a loss that failed at save is the verdict's reason
    return compare(where, evaluate(settings, model, batch), reference, settings.tolerance)


def settings_for(where: str, meta: dict, settings: ValidationSettings | None) -> ValidationSettings:
    """`settings`, or the ones stored at save (in `meta`) when None; an eval_fn stored at
    save is kept when `settings` names none (the script's own loss)."""
    stored = meta.get("validation")
    if settings is None:
        if not stored:
            raise FactoryError(f"checkpoint {where} names no validation factories; pass them explicitly")
        return ValidationSettings(**stored)
    if not settings.eval_fn and stored and stored.get("eval_fn"):
        return replace(settings, eval_fn=stored["eval_fn"])
    return settings


def reference_loss(where: str, meta: dict) -> float | None:
    """The loss recorded at save; EvalError when computing it failed then (nothing to compare with)."""
    reference = meta.get("reference_loss")
    if reference is None and meta.get("reference_error"):
        raise EvalError(f"checkpoint {where} has no reference loss: at save, {meta['reference_error']}")
    # Only our writer puts it there, under the digests: anything but a number is a bad write.
    if reference is not None and (isinstance(reference, bool) or not isinstance(reference, (int, float))):
        raise CorruptCheckpointError(f"checkpoint {where}: its reference loss {reference!r} is not a number")
    return reference


def compare(uri: str, loss: float, reference: float | None, tolerance: float) -> Verdict:
    """The verdict on a checkpoint whose reloaded state gives `loss`, saved with `reference`."""
    if reference is None:
        return Verdict(False, loss, None, f"checkpoint {uri} stores no reference loss")
    if _close_enough(loss, reference, tolerance):
        return Verdict(True, loss, reference)
    return Verdict(False, loss, reference, f"checkpoint {uri}: loss {loss!r} differs from reference {reference!r} beyond tolerance {tolerance}")


def mark(ref: CheckpointRef, verdict: Verdict) -> None:
    body = verdict.to_json() | {"validated_at": datetime.now(timezone.utc).isoformat()}
    rewrite_beside(ref.storage, ref.key(layout.VALIDATION), json.dumps(body).encode())


def load_model_weights(model: torch.nn.Module, weights: dict, where: str, assign: bool = False) -> None:
    """`model.load_state_dict` with errors that name the checkpoint."""
    weights = _with_tied(model, weights)
    expected = model.state_dict()
    for name, tensor in weights.items():
        if name in expected and tuple(expected[name].shape) != tuple(tensor.shape):
            raise IncompatibleCheckpointError(
                f"checkpoint {where}: {name} has shape {tuple(tensor.shape)}, the model expects {tuple(expected[name].shape)} (a checkpoint of another model?)")
    try:
        model.load_state_dict(weights, assign=assign)
    except RuntimeError as exc:
        raise IncompatibleCheckpointError(f"checkpoint {where} does not fit the model: {exc}") from None


def _with_tied(model: torch.nn.Module, weights: dict) -> dict:
    """`weights` with every name of a parameter the model ties (an LM head sharing the
    embedding): a safetensors file stores a tied tensor once (Accelerate's save_state drops
    the other names), and a strict load wants them all."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    filled = dict(weights)
    for group in names.values():
        stored = next((name for name in group if name in weights), None)
        if stored is not None:
            filled.update({name: weights[stored] for name in group if name not in weights})
    return filled
