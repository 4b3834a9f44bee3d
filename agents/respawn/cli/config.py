"""Where the CLI finds the control plane and its token.

RESPAWN_URL / RESPAWN_TOKEN win over the credentials file that `respawn login`
writes (~/.config/respawn/credentials, or under $XDG_CONFIG_HOME): a JSON object
{"url": ..., "token": ...}, readable by its owner only (0600).

A plain http:// URL is taken only for loopback (127.0.0.0/8, ::1, localhost) unless
`--insecure-http` or RESPAWN_INSECURE_HTTP=1 says so: the token, and the password at
login, would cross the network in clear."""

from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from respawn.cli.errors import EXIT_AUTH, EXIT_BAD_INPUT, CliError

INSECURE_HTTP_ENV = "RESPAWN_INSECURE_HTTP"


@dataclass(frozen=True)
class Credentials:
    url: str
    token: str


def credentials_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "respawn" / "credentials"


def _saved() -> dict:
    path = credentials_path()
    if not path.exists():
        return {}
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CliError(f"cannot read {path}: {e}; run `respawn login` again", EXIT_AUTH) from e
    return saved if isinstance(saved, dict) else {}


def server_url(flag: str | None = None, *, insecure_http: bool = False) -> str | None:
    url = flag or os.environ.get("RESPAWN_URL") or _saved().get("url")
    if url and urlsplit(url).scheme.lower() == "http" and not _loopback(urlsplit(url).hostname):
        if not (insecure_http or os.environ.get(INSECURE_HTTP_ENV) == "1"):
            raise CliError(f"refusing {url}: plain http:// would send your token (and password) in clear text to "
                           "a host that is not this machine; use https://, or pass --insecure-http (or set "
                           f"{INSECURE_HTTP_ENV}=1) if the network on the way is yours", EXIT_BAD_INPUT)
    return url.rstrip("/") if url else None


def _loopback(host: str | None) -> bool:
    if host is None:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host.lower() == "localhost"


def load_credentials(url_flag: str | None = None, *, insecure_http: bool = False) -> Credentials:
    url = server_url(url_flag, insecure_http=insecure_http)
    token = os.environ.get("RESPAWN_TOKEN") or _saved().get("token")
    if not url or not token:
        raise CliError("not logged in: run `respawn login --url URL`, or set RESPAWN_URL and RESPAWN_TOKEN",
                       EXIT_AUTH)
    return Credentials(url, token)


def save_credentials(credentials: Credentials) -> Path:
    path = credentials_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Created 0600 from the start, and fixed if an older file was wider: it holds a secret.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        json.dump({"url": credentials.url, "token": credentials.token}, f)
    return path
