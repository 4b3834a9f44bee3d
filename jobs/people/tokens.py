"""Secrets handed out once and stored only as SHA-256 digests.

Tokens are 256-bit random, so a plain (unsalted) SHA-256 is enough: there is
nothing to brute-force, and an indexed lookup by digest keeps auth one query."""

import hashlib
import secrets

PERSONAL_PREFIX = "rsp_"
BOOTSTRAP_PREFIX = "rsb_"
AGENT_PREFIX = "rsa_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(prefix: str) -> tuple[str, str]:
    """A fresh token and its digest."""
    token = prefix + secrets.token_urlsafe(32)
    return token, hash_token(token)
