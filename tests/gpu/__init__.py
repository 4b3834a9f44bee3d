"""Tests that need a CUDA device: marked `cuda` and skipped without one. bench/gpu_check.sh
runs them, and the GPU stall bench, on a machine that has one."""

import pytest
import torch

CUDA = [pytest.mark.cuda,
        pytest.mark.skipif(not torch.cuda.is_available(),
                           reason="needs a CUDA device and torch sees none here (bench/gpu_check.sh runs these on a GPU machine)")]


def on_host(obj):
    """`obj` (nested dicts, lists, tuples) with each tensor copied to the host now, synchronously."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: on_host(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(on_host(v) for v in obj)
    return obj
