"""Between the compiler's snapshot and the wire's: field names match, so the mapping is JSON."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf import json_format
from meridian_pb.fleet.v1 import fleet_pb2 as pb
from meridian_pb.fleet.v1.content import digest
from pydantic import BaseModel

from controlplane.snapshot import RegionSnapshot


def to_wire(snapshot: RegionSnapshot) -> pb.Snapshot:
    """The snapshot as a message, every node's plan in it, with its content digest set."""
    message = wire_message(snapshot.model_dump(mode="json"))
    message.digest = digest(message)
    return message


def wire_message(doc: dict[str, Any]) -> pb.Snapshot:
    """A snapshot's fields (or some of them), as the compiler's models dump them."""
    for tenant in doc.get("tenants", ()):
        allowed = tenant.pop("allowed_jurisdictions")
        if allowed is not None:
            tenant["allowed_jurisdictions"] = {"names": allowed}
    return json_format.ParseDict(doc, pb.Snapshot())


def wire_items(field: str, items: Sequence[BaseModel]) -> list[Any]:
    """The elements of one of a snapshot's lists, as messages."""
    holder = wire_message({field: [item.model_dump(mode="json") for item in items]})
    return list(getattr(holder, field))


def telemetry_doc(telemetry: pb.Telemetry) -> dict[str, Any]:
    return json_format.MessageToDict(
        telemetry, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def peer_load_message(doc: dict[str, Any]) -> pb.PeerLoad:
    return json_format.ParseDict(doc, pb.PeerLoad(), ignore_unknown_fields=True)
