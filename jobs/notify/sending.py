"""One attempt at one delivery: the message in the subscription's channel, sent with
a short timeout, and its outcome recorded whatever it was.

A generic webhook gets the notification as JSON, signed: `X-Respawn-Signature` is
`sha256=` + HMAC-SHA256(secret, `{X-Respawn-Timestamp}.` + body), so a receiver checks
the body is ours and recent. The secret is stored sealed and opened here only, to
sign; one the secrets key no longer opens fails the delivery for good, saying why. A
Slack-compatible webhook gets `{"text": ...}` (its URL, the secret there, is stored in
the clear); email goes through Django's email backend."""

from __future__ import annotations

import hashlib
import hmac
import json
import smtplib
import time

import requests
from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError
from django.utils import timezone

from jobs.core import secret_env
from jobs.core.choices import Channel, DeliveryStatus
from jobs.models import Delivery, DeliveryAttempt, Subscription
from jobs.notify.addresses import UnsafeURL, check_url

USER_AGENT = "Respawn-Notify/1"
ERROR_CHARS = 500  # of an endpoint's answer, in the attempt's record
RETRIED_CODES = frozenset({408, 425, 429})  # 4xx that say "later", not "never"


class DeliveryFailed(Exception):
    """This attempt failed in a way a later one may not (an endpoint down, slow, 5xx)."""


class Refused(Exception):
    """No attempt can succeed (the address is not allowed, the endpoint says 4xx)."""

    def __init__(self, message: str, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code


class Retryable(Refused):
    pass


def signature(secret: str, timestamp: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def payload(delivery: Delivery) -> dict:
    n = delivery.notification
    return {"delivery": delivery.pk, "kind": n.kind, "title": n.title, "text": n.text,
            "created_at": n.created_at.isoformat(), "details": n.details}


def slack_text(delivery: Delivery) -> str:
    n = delivery.notification
    rest = n.text.removeprefix(n.title).lstrip(":\n ")
    return f"*{n.title}*" + (f"\n```{rest}```" if "\n" in rest else (f"\n{rest}" if rest else ""))


def post(url: str, body: bytes, headers: dict) -> int:
    """POST once, following no redirect; the status code, or Retryable / Refused."""
    try:
        check_url(url)  # again: the name may resolve elsewhere since it was saved
    except UnsafeURL as exc:
        raise Refused(f"refused: {exc}") from None
    timeout = settings.NOTIFY["TIMEOUT_S"]
    try:
        answer = requests.post(url, data=body, headers={"Content-Type": "application/json", "User-Agent": USER_AGENT,
                                                         **headers}, timeout=timeout, allow_redirects=False)
    except requests.Timeout:
        raise Retryable(f"no answer within {timeout:g} s") from None
    except requests.RequestException as exc:
        raise Retryable(f"could not connect: {exc.__class__.__name__}: {exc}"[:ERROR_CHARS]) from None
    if 200 <= answer.status_code < 300:
        return answer.status_code
    said = f"HTTP {answer.status_code}: {answer.text[:ERROR_CHARS]}".strip()
    if answer.status_code >= 500 or answer.status_code in RETRIED_CODES:
        raise Retryable(said, answer.status_code)
    if 300 <= answer.status_code < 400:
        said += " (redirects are not followed)"
    raise Refused(said, answer.status_code)


def send(delivery: Delivery) -> int | None:
    sub = delivery.subscription
    if sub.channel == Channel.EMAIL:
        n = delivery.notification
        try:
            send_mail(n.title, n.text, settings.DEFAULT_FROM_EMAIL, [sub.email], fail_silently=False)
        except (smtplib.SMTPException, OSError) as exc:
            raise Retryable(f"email not sent: {exc}"[:ERROR_CHARS]) from None
        return None
    if sub.channel == Channel.SLACK:
        return post(sub.url, json.dumps({"text": slack_text(delivery)}).encode(), {})
    try:
        secret = secret_env.unseal_value(sub.secret)
    except secret_env.SecretsKeyError as exc:
        raise Refused(f"cannot sign: the webhook's signing secret cannot be decrypted ({exc}); make the subscription "
                      "again for a new secret") from None
    body = json.dumps(payload(delivery), sort_keys=True).encode()
    timestamp = str(int(time.time()))
    return post(sub.url, body, {"X-Respawn-Timestamp": timestamp, "X-Respawn-Delivery": str(delivery.pk),
                                "X-Respawn-Event": delivery.notification.kind,
                                "X-Respawn-Signature": signature(secret, timestamp, body)})


def attempt(delivery_id: int, *, last: bool) -> None:
    """Try `delivery_id` once. Safe to run twice: an attempt is claimed by a guarded
    update of the attempt count, and a delivery sent or given up is left alone. Raises
    DeliveryFailed for the task to retry, unless `last` (or nothing could ever succeed):
    then the delivery fails and its subscription is marked failing, with the reason."""
    delivery = Delivery.objects.select_related("notification", "subscription").filter(pk=delivery_id).first()
    if delivery is None or delivery.status != DeliveryStatus.PENDING:
        return
    if not Delivery.objects.filter(pk=delivery_id, status=DeliveryStatus.PENDING,
                                   attempts=delivery.attempts).update(attempts=delivery.attempts + 1):
        return  # another worker holds this attempt
    started, clock = timezone.now(), time.monotonic()
    code, error, retry = None, "", False
    try:
        code = send(delivery)
    except Refused as exc:
        code, error, retry = exc.status_code, str(exc), isinstance(exc, Retryable)
    try:
        DeliveryAttempt.objects.create(delivery_id=delivery_id, started_at=started,
                                       duration_s=time.monotonic() - clock, status_code=code, error=error, ok=not error)
    except IntegrityError:
        return  # the subscription was deleted meanwhile, and its deliveries with it
    if not error:
        Delivery.objects.filter(pk=delivery_id).update(status=DeliveryStatus.SENT, delivered_at=timezone.now(),
                                                       last_error="")
        Subscription.objects.filter(pk=delivery.subscription_id).exclude(failing_reason="").update(
            failing_reason="", failing_since=None)
        return
    if retry and not last:
        Delivery.objects.filter(pk=delivery_id).update(last_error=error)
        raise DeliveryFailed(error)
    tries = delivery.attempts + 1
    reason = f"{delivery.notification.title}: {error} ({tries} attempt{'s' if tries > 1 else ''})"
    Delivery.objects.filter(pk=delivery_id).update(status=DeliveryStatus.FAILED, last_error=error)
    Subscription.objects.filter(pk=delivery.subscription_id).update(failing_reason=reason,
                                                                    failing_since=timezone.now())
