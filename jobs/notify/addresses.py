"""Which webhook URLs the control plane may call.

A webhook is a request our servers make to an address a person typed, so an address
inside our own network (the cloud's metadata service above all, which hands out the
control plane's credentials) is refused: checked when the subscription is saved and
again before each send, since a name can resolve elsewhere by then. The send connects
to the very address that check chose (`resolve`), never looking the name up again: a
name that answers the check with a public address and the connect with 127.0.0.1 (DNS
rebinding) reaches nothing inside. Redirects are never followed (respawn_server.jobs.notify.sending),
so a checked address cannot forward the request elsewhere either."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

# Metadata services not all in the link-local range (AWS's IPv6 one is a private address).
METADATA = frozenset(ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200"))


class UnsafeURL(ValueError):
    """The URL may not be called; the message says why, for the person who typed it."""


def refusal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """Why a webhook may not go to `ip`, or '' when it may."""
    if ip.version == 6 and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    if ip in METADATA or ip.is_link_local:
        return "a link-local or metadata-service address, never allowed"
    if ip.is_multicast or ip.is_unspecified:
        return "not an address a webhook can be sent to"
    if ip.is_global:
        return ""
    if ip.is_loopback or ip.is_private:
        if settings.NOTIFY["ALLOW_PRIVATE"]:
            return ""
        kind = "a loopback" if ip.is_loopback else "a private"
        return f"{kind} address (this deployment allows only public ones: RESPAWN_NOTIFY_ALLOW_PRIVATE)"
    return "not an address a webhook can be sent to"  # reserved, shared (CGNAT), documentation ranges


@dataclass(frozen=True)
class Target:
    """Where a checked URL's request goes: `address`, one its host resolved to when checked."""

    https: bool
    host: str
    port: int
    address: str

    @property
    def public(self) -> bool:
        """Whether the address is on the internet, not one a deployment's RESPAWN_NOTIFY_ALLOW_PRIVATE let through."""
        return ipaddress.ip_address(self.address).is_global


def check_url(url: str) -> None:
    """Raise UnsafeURL unless `url` is http(s) and every address its host resolves to may be called."""
    resolve(url)


def resolve(url: str) -> Target:
    """Where `url` may be called, resolved once: UnsafeURL unless it is http(s) and every
    address its host resolves to may be called."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise UnsafeURL("only http:// and https:// URLs can receive webhooks")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise UnsafeURL("the port is not a number from 0 to 65535") from None
    host = parts.hostname
    if not host:
        raise UnsafeURL("the URL names no host")
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    except (socket.gaierror, UnicodeError) as exc:
        raise UnsafeURL(f"{host} does not resolve ({exc})") from None
    for address in sorted(found):
        why = refusal(ipaddress.ip_address(address.partition("%")[0]))
        if why:
            raise UnsafeURL(f"{host} resolves to {address}: {why}")
    return Target(https=parts.scheme == "https", host=host, port=port, address=min(found).partition("%")[0])
