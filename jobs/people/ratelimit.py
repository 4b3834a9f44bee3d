"""Rate limits counted in the database, so that one limit holds across every
gunicorn worker and web container of a deployment: the cache is per process on
the embedded default, where two workers let 36 of 60 password guesses through.

Every door that checks a password (the API's token endpoint the CLI signs in
with, the dashboard's sign-in, the Django admin's) counts against the same
"login" limit per client address; minting tokens counts per person. The rates
are DRF's DEFAULT_THROTTLE_RATES ("20/min"), over a sliding window."""

from __future__ import annotations

import time
from datetime import timedelta
from functools import wraps

from django.db import transaction
from django.http import HttpResponse
from django.utils import timezone
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle

from respawn_server.jobs.models import RateLimitBucket

LOGIN = "login"


PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _rate(scope: str) -> tuple[int, int]:
    """(attempts, period in seconds) of a scope's rate, read as DRF reads it ("20/min")."""
    attempts, period = api_settings.DEFAULT_THROTTLE_RATES[scope].split("/")
    return int(attempts), PERIODS[period[0]]


def take(scope: str, ident: str) -> float | None:
    """Count one attempt of `ident` at `scope`; None if it may go ahead, else the seconds
    until it may (a refused attempt is not counted, so waiting out the period works)."""
    limit, period = _rate(scope)
    now = time.time()
    with transaction.atomic():
        RateLimitBucket.objects.get_or_create(scope=scope, ident=ident)
        # The row lock queues concurrent attempts of one client (SQLite: the IMMEDIATE
        # transaction's write lock), so two workers cannot both take the last one.
        bucket = RateLimitBucket.objects.select_for_update().get(scope=scope, ident=ident)
        recent = [at for at in bucket.hits if at > now - period]
        if len(recent) >= limit:
            return recent[0] + period - now
        bucket.hits = [*recent, now]
        bucket.save(update_fields=["hits", "updated_at"])
        RateLimitBucket.objects.filter(scope=scope, updated_at__lt=timezone.now() - timedelta(seconds=period)).delete()
    return None


def client_address(request) -> str:
    """The client's address, trusting only RESPAWN_NUM_PROXIES entries of X-Forwarded-For."""
    return BaseThrottle().get_ident(request)


class SharedRateThrottle(BaseThrottle):
    """DRF's throttle for a view's `throttle_scope`: per client address for the login,
    per person (else address) for the rest."""

    def allow_request(self, request, view) -> bool:
        scope = view.throttle_scope
        person = getattr(request.user, "pk", None) if scope != LOGIN else None
        self.wait_s = take(scope, f"user:{person}" if person is not None else client_address(request))
        return self.wait_s is None

    def wait(self) -> float | None:
        return self.wait_s


def login_rate_limited(view):
    """A Django sign-in view whose password posts count against the API's login limit."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if request.method == "POST":
            wait = take(LOGIN, client_address(request))
            if wait is not None:
                return HttpResponse(f"Too many sign-in attempts from this address; try again in {wait:.0f} s.",
                                    status=429, content_type="text/plain", headers={"Retry-After": f"{wait:.0f}"})
        return view(request, *args, **kwargs)

    return wrapper
