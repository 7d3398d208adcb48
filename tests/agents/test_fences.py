"""The gateway executes the router's plan; it decides nothing by catching exceptions. A routing
outcome (a plan, how a worker's or a peer's go ended) is a value: no `except` in
agents/gateway/ names one, nor a refusal the plan makes. What the gateway still catches is the
I/O's own errors and, once, at the top of a request, the error that answers a request it does
not take (a bad body, a bad key). The import fences between the planes and the layers are
import-linter's (`lint-imports`, run by scripts/test with its contracts in pyproject.toml)."""

from __future__ import annotations

import ast
from pathlib import Path

from agents.gateway import errors, relay
from agents.router import plan

GATEWAY = Path(__file__).resolve().parents[2] / "agents" / "gateway"
OUTCOMES = (
    plan.Local, plan.Pair, plan.Continue, plan.Peer, plan.MoveTier, plan.Reject,
    relay.Answered, relay.Retry, relay.Cut, relay.Broken, relay.Refused, relay.ClientGone,
)  # fmt: skip
REFUSALS = {cls.__name__ for cls in errors.REFUSALS.values()}


def _caught() -> dict[str, set[str]]:
    """Each gateway module's names in `except` clauses."""
    found: dict[str, set[str]] = {}
    for path in sorted(GATEWAY.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ExceptHandler) and node.type is not None:
                kinds = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
                names = {ast.unparse(kind).rsplit(".", 1)[-1] for kind in kinds}
                found.setdefault(path.name, set()).update(names)
    return found


def test_routing_outcomes_are_values_and_no_except_in_the_gateway_catches_one() -> None:
    assert not [kind for kind in OUTCOMES if issubclass(kind, BaseException)]
    caught = _caught()
    assert caught, "the gateway's modules were not read"
    outcomes = {kind.__name__ for kind in OUTCOMES}
    # the plan's refusals (429, 503, 502) are made from its Reject, at the answer, never
    # raised and caught to decide what happens next
    assert {
        m: n & (outcomes | REFUSALS) for m, n in caught.items() if n & (outcomes | REFUSALS)
    } == {}
    # the error that answers a request the gateway does not take: caught where it becomes the
    # answer (the request's top: an inference's, the Batch API's pass-through's, /v1/models),
    # or to name its model on the way up (parsing)
    catching = {m for m, names in caught.items() if "GatewayError" in names}
    assert catching <= {"service.py", "batches.py", "models.py", "requests.py"}, catching
