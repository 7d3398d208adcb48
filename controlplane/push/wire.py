"""Between the compiler's snapshot and the wire's: field names match, so the mapping is JSON."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from meridian_pb.fleet.v1 import fleet_pb2 as pb
from meridian_pb.fleet.v1.content import digest

from controlplane.snapshot import RegionSnapshot


def to_wire(snapshot: RegionSnapshot) -> pb.Snapshot:
    """The snapshot as a message, with its content digest set."""
    doc: dict[str, Any] = snapshot.model_dump(mode="json")
    for tenant in doc["tenants"]:
        allowed = tenant.pop("allowed_jurisdictions")
        if allowed is not None:
            tenant["allowed_jurisdictions"] = {"names": allowed}
    message = json_format.ParseDict(doc, pb.Snapshot())
    message.digest = digest(message)
    return message


def telemetry_doc(telemetry: pb.Telemetry) -> dict[str, Any]:
    return json_format.MessageToDict(
        telemetry, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def peer_load_message(doc: dict[str, Any]) -> pb.PeerLoad:
    return json_format.ParseDict(doc, pb.PeerLoad(), ignore_unknown_fields=True)
