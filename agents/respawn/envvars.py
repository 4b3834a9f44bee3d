"""Reading numeric settings from the environment, for the agent and the trainer library alike."""

from __future__ import annotations

import os


def env_float(name: str, error: type[ValueError] = ValueError) -> float | None:
    """`name` as a float; None when unset or blank. A value that is not a number raises
    `error` (the caller's own ValueError subclass, so its handler names the setting)."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        raise error(f"environment variable {name}={value!r} is not a number") from None
