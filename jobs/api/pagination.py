"""Pages of the people's API: DRF's limit and offset with a largest page. Unbounded,
a limit beyond 64 bits reached the database (a 500; an offset past the end is an
empty page before any query), and `limit=10**9` asked for every row at once."""

from __future__ import annotations

from rest_framework.pagination import LimitOffsetPagination


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    max_limit = 1000
