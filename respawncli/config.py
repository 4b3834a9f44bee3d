"""Where the CLI finds the control plane and its token.

RESPAWN_URL / RESPAWN_TOKEN win over the credentials file that `respawn login`
writes (~/.config/respawn/credentials, or under $XDG_CONFIG_HOME): a JSON object
{"url": ..., "token": ...}, readable by its owner only (0600)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from respawncli.errors import EXIT_AUTH, CliError


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


def server_url(flag: str | None = None) -> str | None:
    url = flag or os.environ.get("RESPAWN_URL") or _saved().get("url")
    return url.rstrip("/") if url else None


def load_credentials(url_flag: str | None = None) -> Credentials:
    url = server_url(url_flag)
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
