"""Secret values at rest (DESIGN §11): a job's secret env values and a webhook
subscription's signing secret.

A job's `secret_env` keeps each name in the clear (every viewer of the job may
see which secrets it has) and each value as a Fernet token (AES-128-CBC with an
HMAC-SHA256) under the deployment's secrets key; a subscription's `secret` is one
such token. Values are decrypted in two places only: the register answer to one
of the job's live instances (respawn_server.jobs.api.agent.job_spec), and the signing of a
webhook delivery (respawn_server.jobs.notify.sending).

The key is `RESPAWN_SECRETS_KEY` (or a file named by `RESPAWN_SECRETS_KEY_FILE`):
one Fernet key, or several separated by commas for a rotation, the first
encrypting and every one decrypting (`manage.py rotate_secrets_key` re-encrypts
every stored value under the first). Unset, the key is `var/secrets.key`, made
(0600) at first use: a laptop default, like the generated Django secret key.
Lose the key and every stored secret value is lost with it: a job whose values
cannot be decrypted fails its register (cause setup) and must be submitted again;
a webhook whose secret cannot be decrypted fails each delivery (the subscription
says why) and must be made again for a new secret.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings


class SecretsKeyError(Exception):
    """The secrets key cannot decrypt a stored value (the key was lost or replaced)."""


LOST = "no configured secrets key decrypts it: the key was replaced or lost since it was stored"


def _key_file_key(path: Path) -> bytes:
    """The key in `path`, made first if missing. Made beside and then linked into
    place, so two processes starting at once end up with the same key, never a
    half-written one."""
    try:
        return path.read_bytes().strip()
    except FileNotFoundError:
        pass
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(Fernet.generate_key())
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass  # another process made it first: use theirs
    finally:
        tmp.unlink()
    return path.read_bytes().strip()


def _fernet() -> MultiFernet:
    configured = settings.RESPAWN["SECRETS_KEY"]
    if configured:
        keys = [key.strip().encode() for key in configured.split(",") if key.strip()]
    else:
        keys = [_key_file_key(Path(settings.RESPAWN["SECRETS_KEY_FILE"]))]
    return MultiFernet([Fernet(key) for key in keys])


def seal_value(value: str) -> str:
    """`value` encrypted under the first key, for storing."""
    return _fernet().encrypt(value.encode()).decode()


def unseal_value(token: str) -> str:
    """The plaintext of a stored value; SecretsKeyError when no configured key decrypts it."""
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        raise SecretsKeyError(LOST) from None


def rotate_value(token: str) -> str:
    """`token` re-encrypted under the first configured key (MultiFernet.rotate); SecretsKeyError as unseal_value."""
    try:
        return _fernet().rotate(token.encode()).decode()
    except InvalidToken:
        raise SecretsKeyError(LOST) from None


def seal(values: dict[str, str]) -> dict[str, str]:
    """`values` with each value encrypted, for storing."""
    return {name: seal_value(value) for name, value in values.items()}


def unseal(sealed: dict[str, str]) -> dict[str, str]:
    """The plaintext values of a stored `secret_env`; SecretsKeyError names those the key cannot decrypt."""
    values, lost = {}, []
    for name, token in sealed.items():
        try:
            values[name] = unseal_value(token)
        except SecretsKeyError:
            lost.append(name)
    if lost:
        raise SecretsKeyError(f"the secrets key cannot decrypt secret_env {', '.join(sorted(lost))}: it was replaced "
                              "or lost since the job was submitted; submit the job again with its secrets")
    return values


def rotate(sealed: dict[str, str]) -> dict[str, str]:
    """`sealed` with each value re-encrypted under the first configured key; SecretsKeyError as unseal_value."""
    return {name: rotate_value(token) for name, token in sealed.items()}
