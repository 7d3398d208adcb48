"""Bearer secrets: made from the OS's randomness, shown once, stored only as SHA-256.

The secrets are 256 random bits, so a fast hash is enough: nothing can be guessed from it,
and agents can check an API key against it on the request path in microseconds.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass


@dataclass(frozen=True)
class Secret:
    value: str
    prefix: str
    digest: str


def hash_secret(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def new_secret(kind: str, prefix: str | None = None) -> Secret:
    """A secret such as `mk-3f9a1c2e.<43 chars>`; the part before the dot identifies it (and
    stays the same across a rotation, given as `prefix`: budgets and usage name it)."""
    ident = prefix.removeprefix(f"{kind}-") if prefix is not None else secrets.token_hex(4)
    value = f"{kind}-{ident}.{secrets.token_urlsafe(32)}"
    return Secret(value=value, prefix=f"{kind}-{ident}", digest=hash_secret(value))


def new_name(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"
