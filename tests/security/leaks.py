"""Finding secrets where they must not be: any of our tokens, known or not, by its shape."""

from __future__ import annotations

import re
from pathlib import Path

from django.db import connection

# rsp_ personal, rsa_ agent, rsb_ bootstrap: a prefix then 43 url-safe base64 characters
# (256 bits). Stored prefixes (8 characters) and hex digests never match.
TOKEN_SHAPE = re.compile(r"rs[pab]_[A-Za-z0-9_-]{40,}")


def tokens_in(text: str) -> list[str]:
    return TOKEN_SHAPE.findall(text)


def tokens_in_database() -> list[tuple[str, str, str]]:
    """(table, column, token) for every token found in any column of any table, read as text."""
    found = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            columns = [c.name for c in connection.introspection.get_table_description(cursor, table)]
            qn = connection.ops.quote_name
            for column in columns:
                as_text = f"CAST({qn(column)} AS TEXT)"
                cursor.execute(f"SELECT {as_text} FROM {qn(table)} WHERE {as_text} LIKE %s", ["%rs%"])
                for (value,) in cursor.fetchall():
                    found += [(table, column, token) for token in tokens_in(value or "")]
    return found


def tokens_in_files(root: Path, *, skip: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(file, token) for every token in any file under root, except the named files."""
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name not in skip):
        found += [(str(path), token) for token in tokens_in(path.read_bytes().decode("utf-8", "replace"))]
    return found
