"""The identity an escalated request carries to a peer region: a signed assertion.

The sending region signs, with its own Ed25519 key from its snapshot, who the tenant is, which
region the request is for, its request id, why it escalated and a digest of its body, valid for
a short while. The peer checks the signature against the public keys of the regions its
snapshot trusts (those whose fallback rules name it). No secret is shared and none is sent: a
captured assertion serves only that body, to that region, for seconds.

    x-meridian-assertion: <base64url payload>.<base64url signature>
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from cryptography.exceptions import InvalidSignature

from agents.control.compile import RegionConfig, Signer, Tenant
from agents.gateway.errors import Forbidden, Unauthenticated

HEADER = "x-meridian-assertion"
HOP = "x-meridian-hop"  # the region a forwarded request came from: it is never forwarded again
WAITED = "x-meridian-waited-ms"  # how long it waited there: its SLO is end to end
TTL_S = 30.0
MAX_LEN = 4096


@dataclass(frozen=True)
class Assertion:
    origin: str  # the region that escalated
    tenant: Tenant | None  # None: an operator of the fleet
    reason: str
    debug: bool  # the caller may see how it was routed, and asked to


def sign(
    signer: Signer,
    *,
    origin: str,
    audience: str,
    tenant: Tenant | None,
    request_id: str,
    reason: str,
    body: bytes,
    debug: bool,
    clock: Callable[[], float] = time.time,
) -> str:
    payload = orjson.dumps(
        {
            "iss": origin,
            "aud": audience,
            "kid": signer.key_id,
            "ten": tenant.name if tenant is not None else None,
            "rid": request_id,
            "why": reason,
            "dbg": debug,
            "exp": round(clock() + TTL_S, 3),
            "bh": _digest(body),
        }
    )
    return f"{_b64(payload)}.{_b64(signer.key.sign(payload))}"


def verify(
    header: str,
    config: RegionConfig,
    *,
    body: bytes,
    request_id: str | None,
    clock: Callable[[], float] = time.time,
) -> Assertion:
    """The assertion's claims; Unauthenticated for anything not signed for this request here,
    Forbidden for a tenant this region may not serve."""
    try:
        if len(header) > MAX_LEN:
            raise ValueError("too long")
        encoded, _, signature = header.partition(".")
        payload = _unb64(encoded)
        claims = orjson.loads(payload)
        sender = config.senders[claims["iss"]]
        sender.keys[claims["kid"]].verify(_unb64(signature), payload)
    except (ValueError, KeyError, TypeError, InvalidSignature, orjson.JSONDecodeError):
        raise Unauthenticated("the escalation assertion is not valid in this region") from None
    if claims.get("aud") != config.region:
        raise Unauthenticated(f"the assertion is for region {claims.get('aud')}, not this one")
    if not isinstance(claims.get("exp"), int | float) or claims["exp"] <= clock():
        raise Unauthenticated("the escalation assertion has expired")
    if claims.get("bh") != _digest(body) or claims.get("rid") != request_id:
        raise Unauthenticated("the escalation assertion was signed for another request")
    name = claims.get("ten")
    tenant = None
    if name is not None:
        tenant = config.tenants.get(name)
        if tenant is None:
            raise Unauthenticated(f"tenant {name} is not known in this region")
        if tenant.jurisdictions is not None and config.jurisdiction not in tenant.jurisdictions:
            raise Forbidden(
                f"tenant {tenant.name} may not be served in jurisdiction {config.jurisdiction}"
            )
    return Assertion(sender.region, tenant, str(claims.get("why") or ""), claims.get("dbg") is True)


def _digest(body: bytes) -> str:
    return _b64(hashlib.sha256(body).digest())


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
