"""Turning a cloud's error code into what the orchestrator should do next.

Each provider lists its own codes; the order of the checks is shared because it
matters: a throttling code must win over a broader pattern that would also match
it (AWS's `RequestLimitExceeded` is throttling, `VcpuLimitExceeded` is quota).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from respawn_server.jobs.fleet.providers.base import CapacityError, MissingPermission, PrecheckError, ProviderError, TransientError


@dataclass(frozen=True, kw_only=True, slots=True)
class ErrorCodes:
    """One cloud's error codes, by what they mean for us."""

    transient: frozenset[str] = frozenset()
    capacity: frozenset[str] = frozenset()
    capacity_prefixes: tuple[str, ...] = ()
    precheck: frozenset[str] = frozenset()
    precheck_prefixes: tuple[str, ...] = ()
    precheck_suffixes: tuple[str, ...] = ()

    def classify(self, code: str, message: str, *, http_status: int | None = None) -> ProviderError:
        """The error to raise for this code. An unknown code falls back on the HTTP
        status: 429 or 5xx is worth retrying, anything else is a request the cloud
        will keep refusing, so the job fails with the cloud's own message."""
        text = f"{code}: {message}" if code else message
        if code in self.transient:
            return TransientError(text, code=code)
        if code in self.capacity or code.startswith(self.capacity_prefixes):
            return CapacityError(text, code=code)
        if (
            code in self.precheck
            or code.startswith(self.precheck_prefixes)
            or code.endswith(self.precheck_suffixes)
        ):
            return PrecheckError(text, code=code)
        if http_status is None or http_status == 429 or http_status >= 500:
            return TransientError(text, code=code)
        return PrecheckError(text, code=code)


@contextmanager
def naming_permission(permission: str, denied: Collection[str]) -> Iterator[None]:
    """A refusal whose code is one of the cloud's access-denied codes (`denied`) is re-raised
    as MissingPermission naming `permission`, the one the call inside needs."""
    try:
        yield
    except PrecheckError as exc:
        if exc.code in denied:
            raise MissingPermission(str(exc), permission=permission, code=exc.code) from exc
        raise
