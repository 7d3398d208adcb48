"""The identity an escalated request carries to a peer region: a signed assertion.

The sending region signs, with its own Ed25519 key from its snapshot, who the tenant is, which
region the request is for, its request id, its service class, why it escalated, the hop (one:
a peer never sends it on), how long the client has waited already, and a digest of its body,
valid for a short while, with a nonce. The peer checks the signature against the public keys
of the regions its snapshot trusts (those whose fallback rules name it), and remembers each
nonce it accepted until the assertion expires: a replay to the same gateway is refused. No
secret is shared and none is sent: a captured assertion serves only that body, to that region,
once a gateway, for seconds. An assertion names a tenant always: the operator's own requests
are not escalated.

    x-meridian-assertion: <base64url payload>.<base64url signature>
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from cryptography.exceptions import InvalidSignature
from meridian_pb.fleet.v1 import assertion as contract
from meridian_pb.fleet.v1.assertion import MAX_WAITED_MS, digest, unb64
from meridian_pb.fleet.v1.classes import BY_NAME, ServiceClass

from agents.config import RegionConfig, Tenant
from agents.gateway.auth import admissible
from agents.gateway.errors import Unauthenticated
from agents.signing import Signer

MAX_LEN = 4096
HEADER, TTL_S = contract.HEADER, contract.TTL_S


@dataclass(frozen=True)
class Assertion:
    origin: str  # the region that escalated
    tenant: Tenant
    reason: str
    debug: bool  # the caller may see how it was routed, and asked to
    waited_s: float  # what the client waited in the region that escalated: its SLO is end to end
    service_class: ServiceClass | None = None  # the class it was served at there
    key: str = ""  # its API key's public prefix there (the usage ledger's)
    client_request_id: str = ""  # the id its client gave there (the usage ledger's)
    # a part of a request the sender records (a stream carried on, a tier's answer it may
    # cascade): recorded here unbilled
    # (the tokens its client has had: 0 for a tier's answer)
    carried: int | None = None


class Seen:
    """The nonces of the assertions this gateway accepted, until they expire."""

    def __init__(self) -> None:
        self._keys: set[tuple[str, str]] = set()
        self._order: deque[tuple[float, tuple[str, str]]] = deque()

    def first(self, key: tuple[str, str], expires: float, now: float) -> bool:
        """Whether `key` is new (it is then remembered until `expires`)."""
        order = self._order
        while order and order[0][0] <= now:
            self._keys.discard(order.popleft()[1])
        if key in self._keys:
            return False
        self._keys.add(key)
        order.append((expires, key))
        return True


def sign(
    signer: Signer,
    *,
    origin: str,
    audience: str,
    tenant: Tenant,
    request_id: str,
    reason: str,
    body: bytes,
    debug: bool,
    waited_ms: float = 0.0,
    service_class: ServiceClass = ServiceClass.STANDARD,
    clock: Callable[[], float] = time.time,
    api_key: str = "",
    client_request_id: str = "",
    carried: int | None = None,
) -> str:
    signed = contract.payload(
        origin=origin, audience=audience, key_id=signer.key_id, tenant=tenant.name,
        request_id=request_id, reason=reason, body=body, debug=debug, waited_ms=waited_ms,
        service_class=service_class.label, now=clock(), api_key=api_key,
        client_request_id=client_request_id, carried=carried,
    )  # fmt: skip
    return contract.header(signed, signer.key.sign(signed))


def verify(
    header: str,
    config: RegionConfig,
    *,
    body: bytes,
    request_id: str | None,
    seen: Seen,
    clock: Callable[[], float] = time.time,
) -> Assertion:
    """The assertion's claims; Unauthenticated for anything not signed for this request here
    or seen here before, Forbidden for a tenant this region may not serve."""
    try:
        if len(header) > MAX_LEN:
            raise ValueError("too long")
        encoded, _, signature = header.partition(".")
        payload = unb64(encoded)
        claims = orjson.loads(payload)
        sender = config.senders[claims["iss"]]
        sender.keys[claims["kid"]].verify(unb64(signature), payload)
    except (ValueError, KeyError, TypeError, InvalidSignature, orjson.JSONDecodeError):
        raise Unauthenticated("the escalation assertion is not valid in this region") from None
    if claims.get("aud") != config.region:
        raise Unauthenticated("the escalation assertion is for another region")
    now = clock()
    expires = claims.get("exp")
    if not isinstance(expires, int | float) or expires <= now:
        raise Unauthenticated("the escalation assertion has expired")
    if claims.get("bh") != digest(body) or claims.get("rid") != request_id:
        raise Unauthenticated("the escalation assertion was signed for another request")
    waited, name, nonce = claims.get("wt"), claims.get("ten"), claims.get("jti")
    if claims.get("hop") != 1 or not isinstance(waited, int) or not 0 <= waited <= MAX_WAITED_MS:
        raise Unauthenticated("the escalation assertion's hop is not one this region takes")
    if not isinstance(name, str) or not isinstance(nonce, str):
        raise Unauthenticated("an escalation assertion must name its tenant and a nonce")
    tenant = config.tenants.get(name)
    if tenant is None:
        raise Unauthenticated("the assertion's tenant is not known in this region")
    admissible(tenant, config)
    if not seen.first((sender.region, nonce), float(expires), now):
        raise Unauthenticated("the escalation assertion was used already")
    reason, debug = str(claims.get("why") or ""), claims.get("dbg") is True
    named = claims.get("cls")
    served = BY_NAME.get(named) if isinstance(named, str) else None
    if named is not None and served is None:
        raise Unauthenticated("the escalation assertion names no service class this region has")
    key, asked_as, carried = claims.get("key"), claims.get("cid"), claims.get("car")
    if carried is not None and (type(carried) is not int or carried < 0):
        raise Unauthenticated("the escalation assertion's carried tokens are not a count")
    return Assertion(sender.region, tenant, reason, debug, waited / 1000, served,
                     key[:64] if isinstance(key, str) else "",
                     asked_as[:128] if isinstance(asked_as, str) else "",
                     carried)  # fmt: skip
