"""What text a job may carry to its VM. The CLI's job-file check and the people's
API refuse the same (standard library only, like respawncli.names).

A NUL cannot cross execve (it ends a C string, so the word or variable would be
cut there) nor be stored in PostgreSQL's jsonb. An environment variable's name
cannot be empty or hold '=': the first '=' ends the name, so `A=B` set to `C`
would reach the program as `A` set to `B=C`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def nul_problem(texts: Iterable[str]) -> str | None:
    for text in texts:
        if "\x00" in text:
            return f"{text!r} contains a NUL character"
    return None


def env_problem(env: Mapping[str, str]) -> str | None:
    for name, value in env.items():
        if not name:
            return "an environment variable's name must not be empty"
        if "=" in name:
            return f"environment variable name {name!r} must not contain '='"
        if "\x00" in name or "\x00" in value:
            return f"environment variable {name!r} contains a NUL character"
    return None
