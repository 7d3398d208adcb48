"""The keys of escalation: this region's own, which signs the requests it sends a peer, and
those of the regions that may escalate here, from the snapshot."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from meridian_pb.fleet.v1 import fleet_pb2 as pb

from agents.errors import SnapshotInvalid


@dataclass(frozen=True)
class Signer:
    """This region's key for the requests it escalates."""

    key_id: str
    key: Ed25519PrivateKey


@dataclass(frozen=True)
class Sender:
    """A region that may escalate here, and the keys its requests are signed with."""

    region: str
    jurisdiction: str
    keys: Mapping[str, Ed25519PublicKey]


def signer_of(snapshot: pb.Snapshot) -> Signer | None:
    if not snapshot.HasField("signing_key"):
        return None
    try:
        seed = base64.b64decode(snapshot.signing_key.private_key, validate=True)
        key = Ed25519PrivateKey.from_private_bytes(seed)
    except ValueError:
        raise SnapshotInvalid("the region's signing key is not an Ed25519 seed") from None
    return Signer(snapshot.signing_key.key_id, key)


def sender_of(trusted: pb.TrustedRegion) -> Sender:
    keys = {}
    for key_id, raw in trusted.public_keys.items():
        try:
            keys[key_id] = Ed25519PublicKey.from_public_bytes(base64.b64decode(raw, validate=True))
        except ValueError:
            where = f"region {trusted.region}'s key {key_id}"
            raise SnapshotInvalid(f"{where} is not an Ed25519 public key") from None
    return Sender(trusted.region, trusted.jurisdiction, MappingProxyType(keys))
