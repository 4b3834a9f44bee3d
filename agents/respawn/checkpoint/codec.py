"""Turn a nested state (dicts, lists, tuples, tensors, numpy arrays, scalars) into a
JSON skeleton plus a flat list of tensors, and back.

Tensors go to the data files; everything else stays readable in state.json.
Dicts with non-string keys (an optimizer's `state` is keyed by int) and tuples
(Python's RNG state) are tagged so they come back with the same types, which
exact resume needs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

_TENSOR = "__tensor__"
_NDARRAY = "__ndarray__"
_TUPLE = "__tuple__"
_ITEMS = "__items__"
_FLOAT = "__float__"
_DTYPE = "__dtype__"
_TAGS = (_TENSOR, _NDARRAY, _TUPLE, _ITEMS, _FLOAT, _DTYPE)


def flatten(obj: Any, tensors: list[torch.Tensor], where: str = "state") -> Any:
    """Return the JSON skeleton of `obj`, appending its tensors to `tensors`."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj.detach())
        return {_TENSOR: len(tensors) - 1}
    if isinstance(obj, np.ndarray):
        tensors.append(torch.from_numpy(np.ascontiguousarray(obj)))
        return {_NDARRAY: len(tensors) - 1}
    if isinstance(obj, dict):
        if all(isinstance(k, str) and k not in _TAGS for k in obj):
            return {k: flatten(v, tensors, f"{where}.{k}") for k, v in obj.items()}
        return {_ITEMS: [[flatten(k, tensors, where), flatten(v, tensors, f"{where}[{k!r}]")] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {_TUPLE: [flatten(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [flatten(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, torch.dtype):
        return {_DTYPE: str(obj).removeprefix("torch.")}
    if isinstance(obj, (bool, int, str)) or obj is None:
        return obj
    if isinstance(obj, (float, np.floating)):
        value = float(obj)
        # repr() round-trips a float exactly; JSON has no inf/nan, so tag those.
        return value if math.isfinite(value) else {_FLOAT: repr(value)}
    if isinstance(obj, np.integer):
        return int(obj)
    raise TypeError(f"cannot checkpoint {where}: {type(obj).__name__} is not a tensor, array, container or scalar")


def unflatten(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(skeleton, list):
        return [unflatten(v, tensors) for v in skeleton]
    if not isinstance(skeleton, dict):
        return skeleton
    if _TENSOR in skeleton:
        return tensors[skeleton[_TENSOR]]
    if _NDARRAY in skeleton:
        return tensors[skeleton[_NDARRAY]].numpy()
    if _TUPLE in skeleton:
        return tuple(unflatten(v, tensors) for v in skeleton[_TUPLE])
    if _ITEMS in skeleton:
        return {_hashable(unflatten(k, tensors)): unflatten(v, tensors) for k, v in skeleton[_ITEMS]}
    if _FLOAT in skeleton:
        return float(skeleton[_FLOAT])
    if _DTYPE in skeleton:
        return getattr(torch, skeleton[_DTYPE])
    return {k: unflatten(v, tensors) for k, v in skeleton.items()}


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key
