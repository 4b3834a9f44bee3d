"""Readable tables for people, JSON for scripts."""

from __future__ import annotations

import json
import sys

MAX_CELL = 60


def print_json(data) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


def print_json_line(data) -> None:
    """One JSON object per line (JSON Lines), for streams such as `logs --follow --json`."""
    sys.stdout.write(json.dumps(data) + "\n")


def cell(value) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        value = " ".join(str(v) for v in value)
    text = str(value).replace("\n", " ")
    if len(text) > 19 and text[10:11] == "T" and text[4:5] == "-":  # an ISO time: to the second, in UTC as sent
        text = text[:19].replace("T", " ")
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def print_table(rows: list[dict], columns: list[tuple[str, str]], empty: str = "nothing to show") -> None:
    """columns: (heading, key) pairs; a key may be a callable row -> value."""
    if not rows:
        print(empty)
        return
    cells = [[cell(key(row) if callable(key) else row.get(key)) for _, key in columns] for row in rows]
    headings = [heading for heading, _ in columns]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headings)]
    for line in [headings, *cells]:
        print("  ".join(text.ljust(width) for text, width in zip(line, widths)).rstrip())


def print_fields(obj: dict, keys: list[str] | None = None) -> None:
    keys = keys or list(obj)
    width = max(len(k) for k in keys)
    for key in keys:
        value = obj.get(key)
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
        print(f"{key.ljust(width)}  {cell(value) if not isinstance(value, str) or len(value) <= MAX_CELL else value}")
