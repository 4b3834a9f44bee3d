"""Suggesting the field a person meant. The CLI's job-file check and the people's
API both refuse an unknown field with the same suggestion, so this has no
dependency beyond the standard library (the CLI never imports Django)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest_name(name: str, known: Iterable[str]) -> str | None:
    """The known name `name` is most likely a misspelling of, if any is close enough."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return close[0] if close else None
