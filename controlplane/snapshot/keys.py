"""Signing keys (services/sealing/signing.py): their states, and the id and public half of a
seed (Ed25519), derived here."""

from __future__ import annotations

import base64
import hashlib
from functools import lru_cache

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

PUBLISHED, SIGNING, RETIRING = "published", "signing", "retiring"


@lru_cache(maxsize=4096)
def public_key(seed_b64: str) -> tuple[str, str]:
    """(key id, raw public key in base64) of a base64 seed."""
    seed = base64.b64decode(seed_b64)
    raw = Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes_raw()
    return hashlib.sha256(raw).hexdigest()[:16], base64.b64encode(raw).decode()
