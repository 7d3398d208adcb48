"""How long an idle model takes to reach zero engines, at the control plane's defaults: the
planner's core run period by period (`meridian bench planner` reports it beside its table)."""

from __future__ import annotations

from controlplane.services.planner.core import Deployment, Guards, Limits, Observed, plan

MODEL = "llama"


def idle_to_zero(rps: float = 5.0) -> float:
    """Seconds from a model's last request until the planner's core, at the control plane's
    defaults (a period of 30 s, a cool-down of 300 s, the trend's window), plans it no engine
    where `scale_to_zero` allows: it served `rps` for a while, its engine was last changed
    long before, and no daily shape was learned (a shape that expects demand at this hour
    holds an engine for it, by design)."""
    period, last_request = 30.0, 3_600.0
    limits = Limits(0, 4, 0.95, 0.2, True)
    rates: list[tuple[float, float]] = []
    t = last_request - 20 * period
    while t < last_request + 3_600:
        t += period
        rates = [*rates[-19:], (t, rps if t <= last_request else 0.0)]
        seen = Observed(at=t, rates=tuple(rates), served_per_engine=rps)
        d = Deployment(MODEL, "us-east", 1, limits, 1, 3.9, 25.0, 256, last_change_at=0.0)
        (decided,) = plan([d], {(MODEL, "us-east"): seen}, {}, Guards(now=t))
        if decided.taken and decided.target == 0:
            return t - last_request
    return float("inf")
