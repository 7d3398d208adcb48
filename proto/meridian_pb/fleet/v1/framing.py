"""The control stream's framing: part of the wire contract, so written once for both sides.

The control plane builds each node's message from shared bytes (the region's snapshot, its
delta) and the node's own part, field by field: length-delimited fields written one after
another merge, as protobuf decodes them. The field numbers are read from the generated
descriptors, never written here by hand, so that a change to fleet.proto changes them too.
An agent decodes the message with the generated classes.

`STREAM_ACCEPTED`: the initial metadata by which the control plane says it took an agent's
stream (an agent that gets none was refused, and says why).
"""

from __future__ import annotations

from google.protobuf.message import Message

from meridian_pb.fleet.v1 import fleet_pb2 as pb

STREAM_ACCEPTED = "meridian-stream-accepted"


def number(message: type[Message], name: str) -> int:
    """The field number of `name` in `message`, from its descriptor."""
    return int(message.DESCRIPTOR.fields_by_name[name].number)


SNAPSHOT, DELTA = number(pb.ControlMessage, "snapshot"), number(pb.ControlMessage, "delta")
DIGEST, NODES = number(pb.Snapshot, "digest"), number(pb.Snapshot, "nodes")
DELTA_BASE_DIGEST = number(pb.SnapshotDelta, "base_digest")
DELTA_DIGEST = number(pb.SnapshotDelta, "digest")
DELTA_CHANGES = number(pb.SnapshotDelta, "changes")
DELTA_REPLACED = number(pb.SnapshotDelta, "replaced")


def field(number: int, payload: bytes) -> bytes:
    """One length-delimited field of a message, as protobuf encodes it: messages written one
    after another merge, which is how a node's message is made from shared bytes."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
