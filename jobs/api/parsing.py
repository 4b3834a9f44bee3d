"""JSON bodies as both APIs read them.

Python's decoder recurses once per `[` or `{`: a body of 100k `[` is a
RecursionError (a 500) before any view runs, and one nested just below the
interpreter's limit parses but fails later wherever it is walked again (a
JSONField's encoding, the database's). No field of either API nests deeper than
a few levels, so a body nested deeper than MAX_JSON_DEPTH is refused with a 400.
"""

from __future__ import annotations

from rest_framework import parsers
from rest_framework.exceptions import ParseError
from rest_framework.utils import json

MAX_JSON_DEPTH = 32
TOO_DEEP = f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels"


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(TOO_DEEP) from None
        return shallow(data)


def loads(raw: bytes | str):
    """What JSONParser makes of a body already read (DRF's strict JSON: no NaN)."""
    try:
        data = json.loads(raw)
    except RecursionError:
        raise ParseError(TOO_DEEP) from None
    except ValueError as exc:
        raise ParseError(f"JSON parse error - {exc}") from None
    return shallow(data)


def shallow(data):
    """`data`, or ParseError when it nests deeper than MAX_JSON_DEPTH (walked without recursion)."""
    pending = [(data, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                raise ParseError(TOO_DEEP)
            pending.extend((child, depth + 1) for child in (value.values() if isinstance(value, dict) else value))
    return data
