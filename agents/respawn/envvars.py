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


def env_int(name: str, error: type[ValueError] = ValueError) -> int | None:
    """`name` as a whole number; None when unset or blank; otherwise as `env_float`."""
    value = env_float(name, error)
    if value is not None and not value.is_integer():
        raise error(f"environment variable {name}={os.environ[name]!r} is not a whole number")
    return None if value is None else int(value)
