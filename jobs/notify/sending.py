"""One attempt at one delivery: the message in the subscription's channel, sent with
a short timeout, and its outcome recorded whatever it was.

A generic webhook gets the notification as JSON, signed: `X-Respawn-Signature` is
`sha256=` + HMAC-SHA256(secret, `{X-Respawn-Timestamp}.` + body), so a receiver checks
the body is ours and recent. The secret is stored sealed and opened here only, to
sign; one the secrets key no longer opens fails the delivery for good, saying why. A
Slack-compatible webhook gets `{"text": ...}` (its URL, the secret there, is stored in
the clear); email goes through Django's email backend.

A webhook goes to the address its URL's check chose (respawn_server.jobs.notify.addresses.resolve), TLS
naming and verifying the host; and what went wrong is recorded by its kind ("connection
refused", "TLS error", "HTTP 500"), never in an error's own words, which carry the URL:
every viewer of the team reads the delivery log, and a Slack URL's path is its secret.
An endpoint's answer is kept (its first ERROR_CHARS) only from a public address."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import smtplib
import ssl
import time
from urllib.parse import unquote, urlsplit

import urllib3
from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError
from django.utils import timezone
from requests.certs import where as ca_bundle  # the CAs requests trusts (certifi's), as before

from respawn_server.jobs.core import secret_env
from respawn_server.jobs.core.choices import Channel, DeliveryStatus
from respawn_server.jobs.models import Delivery, DeliveryAttempt, Subscription
from respawn_server.jobs.notify.addresses import Target, UnsafeURL, resolve

USER_AGENT = "Respawn-Notify/1"
ERROR_CHARS = 500  # of an endpoint's answer, in the attempt's record
RETRIED_CODES = frozenset({408, 425, 429})  # 4xx that say "later", not "never"
# What a failed connection is called in the delivery log, the first of its causes found here.
FAILURE_KINDS = (
    (ssl.SSLCertVerificationError, "TLS error: certificate verify failed"),
    (ssl.SSLError, "TLS error"),
    (urllib3.exceptions.SSLError, "TLS error"),
    (ConnectionRefusedError, "connection refused"),
    (ConnectionResetError, "connection reset"),
    (urllib3.exceptions.ProtocolError, "connection dropped"),
)


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
    """POST once to the address the check chose, following no redirect; the status code,
    or Retryable / Refused."""
    try:
        target = resolve(url)  # again: the name may resolve elsewhere since it was saved
    except UnsafeURL as exc:
        raise Refused(f"refused: {exc}") from None
    timeout = settings.NOTIFY["TIMEOUT_S"]
    parts = urlsplit(url)
    headers = {"Host": parts.netloc.rpartition("@")[2], "Content-Type": "application/json", "User-Agent": USER_AGENT,
               **_basic_auth(parts.username, parts.password), **headers}
    pool, answer = _pool(target, timeout), None
    try:
        answer = pool.urlopen("POST", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), body=body,
                              headers=headers, retries=False, redirect=False, preload_content=False)
        code = answer.status
        if 200 <= code < 300:
            return code
        said = f"HTTP {code}"
        if target.public:  # an address inside, allowed or not, tells a viewer nothing of itself
            said += _answer_text(answer.read(ERROR_CHARS + len(url)).decode("utf-8", "replace"), parts)
    except urllib3.exceptions.HTTPError as exc:
        # urllib3 makes a refused connection a kind of connect timeout, for its older callers.
        timed_out = isinstance(exc, urllib3.exceptions.TimeoutError) and not isinstance(
            exc, urllib3.exceptions.NewConnectionError)
        raise Retryable(f"no answer within {timeout:g} s" if timed_out else failure_kind(exc)) from None
    finally:
        if answer is not None:
            answer.close()
        pool.close()
    if code >= 500 or code in RETRIED_CODES:
        raise Retryable(said, code)
    if 300 <= code < 400:
        said += " (redirects are not followed)"
    raise Refused(said, code)


def _answer_text(text: str, parts) -> str:
    """An endpoint's answer as the log keeps it: an echo of the URL's path or query (a
    Slack URL's secret) cut out, at most ERROR_CHARS."""
    for secret in (parts.path, parts.query):
        if secret.strip("/"):
            text = text.replace(secret, "…")
    text = text.strip()[:ERROR_CHARS]
    return f": {text}" if text else ""


def _pool(target: Target, timeout: float) -> urllib3.HTTPConnectionPool:
    """One connection to `target.address`; over TLS, the certificate is checked for the host's name, sent as SNI."""
    common = {"timeout": urllib3.Timeout(connect=timeout, read=timeout), "retries": False, "maxsize": 1}
    if not target.https:
        return urllib3.HTTPConnectionPool(target.address, target.port, **common)
    return urllib3.HTTPSConnectionPool(target.address, target.port, server_hostname=target.host,
                                       assert_hostname=target.host, cert_reqs="CERT_REQUIRED", ca_certs=ca_bundle(),
                                       **common)


def _basic_auth(username: str | None, password: str | None) -> dict:
    """A URL's user:password, sent as requests would."""
    if username is None:
        return {}
    pair = f"{unquote(username)}:{unquote(password or '')}".encode()
    return {"Authorization": "Basic " + base64.b64encode(pair).decode()}


def failure_kind(exc: BaseException) -> str:
    """What kind of failure a connection's `exc` is, in words that carry no URL."""
    causes, seen = [], exc
    while seen is not None and seen not in causes:
        causes.append(seen)
        seen = seen.__cause__ or seen.__context__ or next((a for a in seen.args if isinstance(a, BaseException)), None)
    for kind, words in FAILURE_KINDS:
        if any(isinstance(cause, kind) for cause in causes):
            return words
    return "could not connect"


def send(delivery: Delivery) -> int | None:
    sub = delivery.subscription
    if sub.channel == Channel.EMAIL:
        n = delivery.notification
        subject = " ".join(n.title.split())  # one line: a name's line break must not start a header
        try:
            send_mail(subject, n.text, settings.DEFAULT_FROM_EMAIL, [sub.email], fail_silently=False)
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
