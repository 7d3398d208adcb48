"""Regions' signing keys: an Ed25519 seed per region, stored with it; the public half and its
id are derived here, when a snapshot is compiled."""

from __future__ import annotations

import base64
import hashlib
from functools import lru_cache

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


@lru_cache(maxsize=4096)
def public_key(seed_b64: str) -> tuple[str, str]:
    """(key id, raw public key in base64) of a base64 seed."""
    seed = base64.b64decode(seed_b64)
    raw = Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes_raw()
    return hashlib.sha256(raw).hexdigest()[:16], base64.b64encode(raw).decode()
