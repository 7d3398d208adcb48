"""What the planner's core is given, read from the fleet: here, the peers a region's overload
reaches that may take its demand."""

from __future__ import annotations

from controlplane.services.planner.inputs import overflow_peers
from tests.kits.fleet_docs import example, state_from


def test_a_regions_overflow_peers_are_those_its_rules_send_every_overload_to_in_its_jurisdiction(
) -> None:  # fmt: skip
    doc = example()
    state = state_from(doc)
    llama = "llama-3.1-8b-instruct"
    # us-east's rule names eu-west too: another jurisdiction, where residency may forbid it
    assert overflow_peers(state, llama, "us-east") == ("us-west",)
    assert overflow_peers(state, llama, "us-west") == ("us-east",)
    assert overflow_peers(state, llama, "eu-west") == ()  # its rule: failure only
    west = next(r for r in doc["fallback_rules"] if r["region"] == "us-west")
    west["tenant_tier"] = "standard"  # overload escalates one tier's requests, not all
    assert overflow_peers(state_from(doc), llama, "us-west") == ()
