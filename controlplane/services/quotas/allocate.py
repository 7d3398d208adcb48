"""A tenant's global quota split over the agents that serve it, by what each asks for. No I/O.

Every serving agent first gets a floor (`FLOOR` of the budget, split evenly), so that new
traffic anywhere is admitted at once and reported. Then, when the agents together want no
more than the budget, each gets what it wants and what nobody wants goes out by the agents'
static weights (their GPUs), so that an idle tenant's leases are its static shares and growth
anywhere finds room. When they want more, the budget goes out in proportion to what each
wants: every request of the tenant then has the same chance to be admitted wherever it
arrives, as under one global bucket. (Max-min fairness over agents, as Doorman shares
capacity among its clients, would make the unit the agent: a region with two agents would
get twice the share of a region with one for the same traffic.)

An agent's want is what it admitted plus what it refused for the quota over the last
seconds: an agent held at its lease shows its demand by what it refused.

`settle` keeps the leases the agents already hold where the new ones differ little, so that
noise in the demand does not send every agent a lease every period, without the leases ever
summing to more than the budget.
"""

from __future__ import annotations

from dataclasses import dataclass

FLOOR = 0.02  # of the budget, split evenly over the serving agents
CLOSE = 0.02  # a new lease within this fraction of the old one keeps the old one


@dataclass(frozen=True)
class Claim:
    """One agent's part in one quota, per minute: what it wants, and its static weight."""

    want: float
    weight: float = 1.0


def allocate(budget: float, claims: dict[str, Claim], floor: float = FLOOR) -> dict[str, float]:
    """Each agent's share of `budget`; the shares sum to the budget (none for no agent)."""
    if not claims:
        return {}
    if budget <= 0:
        return dict.fromkeys(claims, 0.0)
    n = len(claims)
    base = budget * floor / n
    left = budget - base * n
    above = {name: max(0.0, c.want - base) for name, c in claims.items()}
    wanted = sum(above.values())
    if wanted >= left:
        return {name: base + left * above[name] / wanted for name in claims}
    spare = left - wanted
    total = sum(max(0.0, c.weight) for c in claims.values())
    return {name: base + above[name] + spare * (max(0.0, c.weight) / total if total > 0 else 1 / n)
            for name, c in claims.items()}  # fmt: skip


def settle(
    new: dict[str, float], held: dict[str, float], budget: float, close: float = CLOSE
) -> dict[str, float]:
    """`new`, except that an agent whose lease would change by under `close` of it keeps the
    one it holds, while the total stays within the budget: small rises are skipped first
    (which frees room), then small falls where the room allows."""
    out = dict(new)
    room = budget - sum(out.values())
    near = {n: held[n] for n, v in new.items() if n in held and _near(v, held[n], close)}
    for name, old in near.items():
        if old <= out[name]:
            room += out[name] - old
            out[name] = old
    for gap, name in sorted((old - new[n], n) for n, old in near.items() if old > new[n]):
        if gap <= room:
            out[name] = held[name]
            room -= gap
    return out


def _near(value: float, old: float, close: float) -> bool:
    return abs(value - old) <= close * max(old, 1e-9)
