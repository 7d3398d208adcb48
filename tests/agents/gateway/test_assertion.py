"""The signed assertion an escalated request carries: valid only for its body, its region, its
request id and a few seconds, from a region whose rules name this one."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from meridian_pb.fleet.v1 import fleet_pb2 as pb

from agents.config import RegionConfig, compile_config
from agents.gateway import assertion
from agents.gateway.errors import Forbidden, Unauthenticated

SEEDS = {"us-east": b"\x01" * 32, "eu-west": b"\x02" * 32, "mallory": b"\x03" * 32}
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'


def _public(region: str) -> str:
    key = Ed25519PrivateKey.from_private_bytes(SEEDS[region]).public_key()
    return base64.b64encode(key.public_bytes_raw()).decode()


def _region(name: str, jurisdiction: str, trusts: list[str]) -> RegionConfig:
    snapshot = pb.Snapshot(
        revision=1,
        region=pb.RegionInfo(name=name, cloud="c", jurisdiction=jurisdiction),
        signing_key=pb.SigningKey(
            key_id=f"{name}-k", private_key=base64.b64encode(SEEDS[name]).decode()
        ),
        trusted=[
            pb.TrustedRegion(region=r, jurisdiction="us", public_keys={f"{r}-k": _public(r)})
            for r in trusts
        ],
        tenants=[
            pb.TenantGrant(name="acme", tier="standard"),
            pb.TenantGrant(
                name="usbank", tier="premium",
                allowed_jurisdictions=pb.Jurisdictions(names=["us"]),
            ),
        ],
    )  # fmt: skip
    return compile_config(snapshot)


EAST, EU = _region("us-east", "us", []), _region("eu-west", "eu", ["us-east"])
MALLORY = _region("mallory", "us", [])


def _signed(region: RegionConfig, tenant: str, now: float = 1000.0, **kw: str) -> str:
    assert region.signer is not None
    return assertion.sign(
        region.signer, origin=kw.get("origin", region.region), audience=kw.get("to", "eu-west"),
        tenant=region.tenants[tenant], request_id="r1", reason="overload",
        body=BODY, debug=False, waited_ms=250, clock=lambda: now,
    )  # fmt: skip


def _verify(
    header: str, body: bytes = BODY, rid: str = "r1", now: float = 1001.0, seen: Any = None
) -> str:
    claim = assertion.verify(
        header, EU, body=body, request_id=rid, seen=seen or assertion.Seen(), clock=lambda: now
    )
    return f"{claim.origin}:{claim.tenant.name}:{claim.reason}:{claim.waited_s}"


def _forged_by_east(**changes: Any) -> str:
    """An assertion signed with us-east's own key whose claims were changed before signing
    (as a region that misbehaves, or an older one, would send)."""
    assert EAST.signer is not None
    payload, _, _ = _signed(EAST, "acme").partition(".")
    claims = orjson.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims = {k: v for k, v in (claims | changes).items() if v is not None}
    raw = orjson.dumps(claims)

    def encode(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    return f"{encode(raw)}.{encode(EAST.signer.key.sign(raw))}"


def test_a_trusted_region_s_assertion_names_the_tenant_why_and_the_wait() -> None:
    assert _verify(_signed(EAST, "acme")) == "us-east:acme:overload:0.25"


def test_a_stream_carried_on_says_so_and_a_request_whole_does_not() -> None:
    def carried(header: str) -> bool:
        claim = assertion.verify(header, EU, body=BODY, request_id="r1", seen=assertion.Seen(),
                                 clock=lambda: 1001.0)  # fmt: skip
        return claim.carried is not None

    assert not carried(_forged_by_east())
    assert carried(_forged_by_east(car=12))  # the tokens its client has had: recorded there
    assert carried(_forged_by_east(car=0))  # a tier's answer it may cascade: recorded there


def test_an_assertion_is_accepted_once() -> None:
    seen = assertion.Seen()
    header = _signed(EAST, "acme")
    _verify(header, seen=seen)
    with pytest.raises(Unauthenticated, match="used already"):
        _verify(header, now=1002.0, seen=seen)
    _verify(_signed(EAST, "acme"), now=1002.0, seen=seen)  # another nonce: a new one


@pytest.mark.parametrize(
    "changes",
    [
        {"ten": None},
        {"hop": 2},
        {"hop": None},
        {"wt": -5},
        {"wt": "soon"},
        {"jti": None},
        {"car": -1},
        {"car": "12"},
        {"car": True},
    ],
    ids=[
        "no tenant",
        "a second hop",
        "no hop",
        "a negative wait",
        "a wait as text",
        "no nonce",
        "negative carried tokens",
        "carried tokens as text",
        "carried as a flag",
    ],
)
def test_claims_this_region_does_not_take_are_refused_even_when_signed(
    changes: dict[str, Any],
) -> None:
    _verify(_forged_by_east())  # as signed, it passes
    with pytest.raises(Unauthenticated):
        _verify(_forged_by_east(**changes))


@pytest.mark.parametrize(
    ("header", "body", "rid", "now"),
    [
        (_signed(EAST, "acme"), BODY + b" ", "r1", 1001.0),  # another body
        (_signed(EAST, "acme"), BODY, "r2", 1001.0),  # another request
        (_signed(EAST, "acme"), BODY, "r1", 1000.0 + assertion.TTL_S + 1),  # expired
        (_signed(EAST, "acme", to="us-west"), BODY, "r1", 1001.0),  # for another region
        (_signed(MALLORY, "acme"), BODY, "r1", 1001.0),  # a region it does not trust
        (_signed(MALLORY, "acme", origin="us-east"), BODY, "r1", 1001.0),  # posing as one
        (_signed(EAST, "acme")[:-4] + "AAAA", BODY, "r1", 1001.0),  # a forged signature
        ("not an assertion", BODY, "r1", 1001.0),
    ],
)
def test_anything_else_is_refused(header: str, body: bytes, rid: str, now: float) -> None:
    with pytest.raises(Unauthenticated):
        _verify(header, body, rid, now)


def test_a_tenant_barred_from_the_jurisdiction_is_refused_even_when_signed() -> None:
    with pytest.raises(Forbidden):
        _verify(_signed(EAST, "usbank"))
