"""What an agent tells the control plane each tenant asked of it: part of the wire contract,
so written once for both sides. The agent counts (agents/gateway/demand.py) and reports the
`RATES` per minute over its last seconds, with the tenant's most requests under way at once
and what it was refused for its limit of them; the control plane keeps each agent's last
report (controlplane/services/quotas/demand.py) and splits each tenant's quota by them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meridian_pb.fleet.v1 import fleet_pb2 as pb

RATES = ("admitted_requests", "refused_requests", "admitted_tokens", "refused_tokens")
FIELDS = (*RATES, "peak_concurrent", "refused_concurrent")


@dataclass(frozen=True)
class TenantDemand:
    """One agent's report for one tenant, per minute."""

    admitted_requests: float = 0.0
    refused_requests: float = 0.0
    admitted_tokens: float = 0.0
    refused_tokens: float = 0.0
    refused_by_reason: dict[str, float] = field(default_factory=dict)
    peak_concurrent: float = 0.0  # its most requests under way at once, over the window
    refused_concurrent: float = 0.0  # refused for its limit of them, in the window
    # its budgets' windows as the agent counts them: BudgetUse's fields, by budget
    spend: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def wants_concurrent(self) -> float:
        """Of its limit of requests under way: what it held at most, and one more for each
        it had to refuse."""
        return self.peak_concurrent + self.refused_concurrent

    @property
    def wants_requests(self) -> float:
        return self.admitted_requests + self.refused_requests

    @property
    def wants_tokens(self) -> float:
        return self.admitted_tokens + self.refused_tokens

    def as_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {f: round(getattr(self, f), 3) for f in FIELDS}
        doc["refused_by_reason"] = {k: round(v, 3) for k, v in self.refused_by_reason.items()}
        if self.spend:
            doc["spend"] = self.spend
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> TenantDemand:
        rates = [float(doc.get(f) or 0.0) for f in FIELDS]
        reasons = {str(k): float(v) for k, v in (doc.get("refused_by_reason") or {}).items()}
        spend = {str(k): dict(v) for k, v in (doc.get("spend") or {}).items()}
        return cls(rates[0], rates[1], rates[2], rates[3], reasons, rates[4], rates[5], spend)

    @classmethod
    def from_message(cls, told: pb.TenantDemand) -> TenantDemand:
        rates = [float(getattr(told, f)) for f in FIELDS]
        reasons = dict(told.refused_by_reason)
        spend = {u.budget: {"window": u.window, "used": u.used_nanos, "held": u.held_nanos,
                            "ceiling": u.ceiling_nanos, "seq": u.lease_seq,
                            "wants": u.spent_per_minute + u.refused_per_minute}
                 for u in told.spend}  # fmt: skip
        return cls(rates[0], rates[1], rates[2], rates[3], reasons, rates[4], rates[5], spend)
