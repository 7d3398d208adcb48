"""The content digest of a snapshot: part of the wire contract, so written once for both sides.

The control plane sets it on every snapshot; an agent checks it on the copy it kept on disk,
so that a file cut short (a full disk, a crash of the filesystem) is never run as if it
were the fleet's desired state, and on every snapshot it made from a delta.

A node receives its region's shared part and its own engine plan, so the digest hashes the
two apart: the control plane hashes a region's shared part once per revision and each
node's plan once per change of it, and one node's digest costs a hash of two hashes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from meridian_pb.fleet.v1 import fleet_pb2 as pb

VERSION = b"meridian.fleet.v1.snapshot/2"


def digest(message: pb.Snapshot) -> str:
    """What the agent must run and how it must route: not the revision, not load."""
    return combine(shared_digest(message), (plan_digest(p) for p in message.nodes))


def shared_digest(message: pb.Snapshot) -> bytes:
    """The hash of a snapshot's shared part: all but its node plans, revision, digest and
    peer load."""
    content = pb.Snapshot()
    content.CopyFrom(message)
    content.revision = 0
    content.ClearField("digest")
    content.ClearField("peer_load")
    content.ClearField("nodes")
    return hashlib.sha256(content.SerializeToString(deterministic=True)).digest()


def plan_digest(plan: pb.NodePlan) -> bytes:
    return hashlib.sha256(plan.SerializeToString(deterministic=True)).digest()


def combine(shared: bytes, plans: Iterable[bytes]) -> str:
    """The digest of a shared part (`shared_digest`) with node plans (`plan_digest` each)."""
    whole = hashlib.sha256(VERSION)
    whole.update(shared)
    for plan in plans:
        whole.update(plan)
    return whole.hexdigest()
