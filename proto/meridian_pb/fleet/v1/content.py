"""The content digest of a snapshot: part of the wire contract, so written once for both sides.

The control plane sets it on every snapshot; an agent checks it on the copy it kept on disk,
so that a file cut short (a full disk, a crash of the filesystem) is never run as if it
were the fleet's desired state.
"""

from __future__ import annotations

import hashlib

from meridian_pb.fleet.v1 import fleet_pb2 as pb


def digest(message: pb.Snapshot) -> str:
    """sha256 of what the agent must run and how it must route: not the revision, not load."""
    content = pb.Snapshot()
    content.CopyFrom(message)
    content.revision = 0
    content.ClearField("digest")
    content.ClearField("peer_load")
    return hashlib.sha256(content.SerializeToString(deterministic=True)).hexdigest()
