"""The signed word a request carries into a region that did not authenticate its client: a
peer region's, for a request it escalated, or the control plane's, for a batch's line it
sends (`CONTROL_PLANE`, a name no region can have). Both planes make it alike; the agents
check it (agents/gateway/assertion.py).

    x-meridian-assertion: <base64url payload>.<base64url Ed25519 signature>
"""

from __future__ import annotations

import base64
import hashlib
import os

import orjson

HEADER = "x-meridian-assertion"
CONTROL_PLANE = "@control-plane"  # the issuer of a batch's lines
TTL_S = 30.0
MAX_WAITED_MS = 60_000


def payload(
    *,
    origin: str,
    audience: str,
    key_id: str,
    tenant: str,
    request_id: str,
    reason: str,
    body: bytes,
    debug: bool,
    waited_ms: float,
    service_class: str,
    now: float,
    api_key: str = "",
    client_request_id: str = "",
    carried: int | None = None,
) -> bytes:
    """What is signed: who asks (its tenant; for the usage ledger, its API key's public prefix
    and the request id its client gave), for which region and request, why, its class, the
    hop (one: never sent on), what the client waited, and the body's digest, valid for TTL_S,
    with a nonce. `carried`: the sender records the request whole and the peer its part,
    unbilled: a stream cut mid-answer and carried on there (the tokens its client has had),
    or a tiered request's answer the sender may still cascade (0)."""
    return orjson.dumps(
        {
            "iss": origin,
            "aud": audience,
            "kid": key_id,
            "ten": tenant,
            "rid": request_id,
            "why": reason,
            "dbg": debug,
            "hop": 1,
            "wt": round(min(MAX_WAITED_MS, max(0.0, waited_ms))),
            "exp": round(now + TTL_S, 3),
            "jti": os.urandom(12).hex(),
            "bh": digest(body),
            "cls": service_class,
            **({"key": api_key} if api_key else {}),
            **({"cid": client_request_id} if client_request_id else {}),
            **({"car": carried} if carried is not None else {}),
        }
    )


def header(signed: bytes, signature: bytes) -> str:
    return f"{b64(signed)}.{b64(signature)}"


def digest(body: bytes) -> str:
    return b64(hashlib.sha256(body).digest())


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
