"""Factories named by `module:function` in tests."""

from torch import nn

from respawn.examples import tiny


def wide_model() -> nn.Module:
    model = tiny.make_model()
    model[0] = nn.Linear(tiny.FEATURES, tiny.HIDDEN * 2)
    return model


def eval_fn_that_raises(model, batch) -> float:
    raise ValueError("labels out of range for this vocabulary")


def eval_fn_that_gives_nan(model, batch) -> float:
    return float("nan")


def narrow_dcp_model() -> nn.Module:
    from respawn.examples import dcp_loop

    return dcp_loop.make_model(width=32)
