"""The checks of a wave: the updated targets against those not yet updated, over the same
minutes (Kayenta's way). No I/O.

Agents report, per model and since they started, their answers by code, the answers a peer
gave, and the gateway's TTFT and ITL histograms; the difference between two heartbeats is
what happened in between, whichever heartbeats the leader happened to read. When every
target is updated (the last wave, or a fleet of one), the baseline is the same targets'
minutes before the rollout began. A side with too few answers is not judged: the check
says "wait", never "pass"; and a rate passes only once the evidence rules out a rise past
its margin (within `Z_PASS` standard errors): at light traffic a wave waits for enough
answers rather than passing a change that harms a few percent of them.

One tenant's traffic never rolls a change back: agents report, per model, the tenants with
the most answers that were not "ok", and a rate check that fails is judged again with the
tenant that gave the most of what it counts left out on both sides (its answers and its
bad ones); it fails only if it fails both times, so the evidence must come from more than
one tenant. Where the others had too few answers to judge by (a fleet that one tenant's
traffic is all of), that tenant's answers are the evidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal

from controlplane.schemas.rollout import RolloutChecks
from controlplane.services.rollouts.counts import REFUSALS, Counts, Reading, above, quantile

Verdict = Literal["pass", "fail", "wait"]

Z = 3.0  # standard errors past which a difference of shares is more than chance
Z_PASS = 2.0  # standard errors within which a difference must stay under the margin to pass


@dataclass
class Check:
    check: str
    verdict: Verdict
    figure: str
    model: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"check": self.check, "model": self.model, "verdict": self.verdict,
                "figure": self.figure}  # fmt: skip


@dataclass
class Sides:
    updated: dict[str, Counts]
    baseline: dict[str, Counts]  # the targets not yet updated, same minutes (may be empty)
    before: dict[str, Counts]  # the updated targets before the rollout began
    slo_ms: dict[str, tuple[int | None, int | None]]  # per model: TTFT, ITL


def judge_traffic(
    limits: RolloutChecks, sides: Sides, served: set[str], judged: set[str] | None = None
) -> list[Check]:
    """Per model the updated targets serve, and any other they answered enough for (a model
    new here, or answers given before the model was known, under ""): too few answers is
    "wait". A model they neither serve nor answered enough for is not waited on.

    `judged`: the models the change alters (None: all). Another model is not judged: the
    change does not touch it. A changed model with no traffic on either side, updated or
    not, is judged by the checks that need none (nacks, engines), and the verdict says so;
    one with traffic on one side only waits."""
    checks = []
    answered = {m for m, c in sides.updated.items() if c.answers >= limits.min_requests}
    for model in sorted(served | answered):
        if judged is not None and model not in judged:
            continue
        new = sides.updated.get(model, Counts())
        if judged is not None and _idle(limits, sides, model):
            figure = "no traffic on either side: judged by its nacks and engines"
            checks.append(Check("traffic", "pass", figure, model))
            continue
        base, label = _baseline(limits, sides, model)
        checks.append(_rate("errors", model, new, base, label, limits, Counts.errors,
                            limits.error_rate))  # fmt: skip
        checks.append(_rate("refusals", model, new, base, label, limits,
                            lambda c: c.of(REFUSALS), limits.refusal_rate))  # fmt: skip
        checks.append(_rate("escalated", model, new, base, label, limits,
                            lambda c: c.escalated, limits.escalated_share))  # fmt: skip
        ttft_slo, itl_slo = sides.slo_ms.get(model, (None, None))
        for name, timed, baseline, slo in (
            ("ttft_p99", new.ttft, base.ttft if base else None, ttft_slo),
            ("itl_p99", new.itl, base.itl if base else None, itl_slo),
        ):
            # Only streamed answers are timed: a model answered in whole only is judged on
            # its rates once they have enough answers, not held up waiting for streams.
            if max(timed.values(), default=0) or new.answers < limits.min_requests:
                check = _latency(name, model, timed, baseline, slo, label, limits)
                if check.verdict == "fail" and name == "ttft_p99" and slo is not None:
                    check = _latency_without_top(check, new, slo, limits)
                checks.append(check)
    return checks


def _idle(limits: RolloutChecks, sides: Sides, model: str) -> bool:
    """No side, updated or not yet updated, had enough answers of the model to judge by."""
    return all(
        side.get(model, Counts()).answers < limits.min_requests
        for side in (sides.updated, sides.baseline)
    )


def _baseline(limits: RolloutChecks, sides: Sides, model: str) -> tuple[Counts | None, str]:
    same = sides.baseline.get(model)
    if same is not None and same.answers >= limits.min_requests:
        return same, "targets not yet updated"
    before = sides.before.get(model)
    if before is not None and before.answers >= limits.min_requests:
        return before, "the same targets before"
    return None, "no baseline"


def _rate(
    name: str, model: str, new: Counts, base: Counts | None, label: str,
    limits: RolloutChecks, count: Any, margin: float,
) -> Check:  # fmt: skip
    if new.answers < limits.min_requests:
        return Check(name, "wait", f"{new.answers} of {limits.min_requests} answers", model)
    bad, figure = _worse(new, base, count, margin)
    figure += f" ({label}) of {new.answers} answers"
    if not bad and not _ruled_out(new, base, count, margin):
        # too little yet to rule out harm past the margin: wait for more, never pass
        return Check(name, "wait", f"{figure}; too few yet to rule out {margin:.0%} more", model)
    if bad and new.tenants:  # again without the tenant that gave the most: never one alone
        top = max(new.tenants, key=lambda t: count(Counts(new.tenants[t])))
        left = new.without(top)
        if left.answers >= limits.min_requests:  # others were served here: judge by theirs
            base_left = base.without(top) if base is not None else None
            bad, again = _worse(left, base_left, count, margin)
            figure += f"; without {top}, the most of them: {again}"
    return Check(name, "fail" if bad else "pass", figure, model)


def _ruled_out(new: Counts, base: Counts | None, count: Any, margin: float) -> bool:
    """The updated share is, beyond chance (`Z_PASS` standard errors), not past the
    baseline's by the margin: what a wave must show to pass."""
    n, x = new.answers, count(new)
    m, y = (base.answers, count(base)) if base is not None else (0, 0)
    share, base_share = x / max(n, 1), (y / m if m else 0.0)
    pooled = (x + y + 1) / (n + m + 2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / max(n, 1) + 1 / max(m or n, 1)))
    return bool(share - base_share + Z_PASS * se <= margin)


def _worse(new: Counts, base: Counts | None, count: Any, margin: float) -> tuple[bool, str]:
    """The updated share past the baseline's by the margin, twice it, and more than chance
    explains: `Z` standard errors of the difference of two shares (one flagged and one clean
    answer added, so that two clean sides still leave room for chance; without a baseline,
    as if it were the same size)."""
    n, x = new.answers, count(new)
    m, y = (base.answers, count(base)) if base is not None else (0, 0)
    share = x / n if n else 0.0
    base_share = y / m if m else 0.0
    pooled = (x + y + 1) / (n + m + 2)
    chance = Z * math.sqrt(pooled * (1 - pooled) * (1 / max(n, 1) + 1 / max(m or n, 1)))
    bad = share > base_share + max(margin, chance) and share > 2 * base_share
    return bad, f"{share:.1%} vs {base_share:.1%}"


def _latency(
    name: str, model: str, new: dict[float, int], base: dict[float, int] | None,
    slo_ms: int | None, label: str, limits: RolloutChecks,
) -> Check:  # fmt: skip
    observed = max(new.values(), default=0)
    if observed < limits.min_requests:
        return Check(name, "wait", f"{observed} of {limits.min_requests} timed answers", model)
    p99 = (quantile(new, 0.99) or 0.0) * 1000
    if base is not None and max(base.values(), default=0) >= limits.min_requests:
        base_p99: float | None = (quantile(base, 0.99) or 0.0) * 1000
    else:
        base_p99, label = None, "no baseline"
    slo = f"SLO {slo_ms} ms" if slo_ms is not None else "no SLO"
    shown = f"{base_p99:.0f} ms" if base_p99 is not None else "-"
    figure = f"{p99:.0f} ms vs {shown} ({label}); {slo}"
    over_slo = slo_ms is not None and p99 > slo_ms
    worse = base_p99 is None or p99 > limits.latency_ratio * max(base_p99, 1.0)
    return Check(name, "fail" if over_slo and worse else "pass", figure, model)


def _latency_without_top(check: Check, new: Counts, slo_ms: int, limits: RolloutChecks) -> Check:
    """A p99 past the SLO, judged again without the tenant whose first tokens came past it
    most often (its huge prompts, say): the rest's p99 is past the SLO when more than 1% of
    their timed answers are."""
    slow = {t: c.get("@slow_ttft", 0) for t, c in new.tenants.items()}
    if not slow or not max(slow.values()):
        return check
    top = max(slow, key=lambda t: slow[t])
    observed = max(new.ttft.values(), default=0)
    rest = observed - new.tenants[top].get("@timed", 0)
    if rest < limits.min_requests:  # the others too few to judge by: its answers stand
        return check
    share = max(0.0, above(new.ttft, slo_ms / 1000) - slow[top]) / rest
    figure = f"{check.figure}; without {top}, the most of them: {share:.1%} past the SLO"
    return replace(check, verdict="fail" if share > 0.01 else "pass", figure=figure)


@dataclass
class NodeView:
    """An updated node as the leader reads it: what it was sent, what it runs, its engines."""

    name: str
    health: str
    desired: int | None
    applied: int | None
    nack: str | None
    reading: Reading | None


def judge_nodes(
    limits: RolloutChecks, nodes: list[NodeView], at_wave: dict[str, Reading]
) -> list[Check]:
    """Nacks, acks, and engines that fail to start or crash-loop on the updated nodes."""
    behind = [n for n in nodes if (n.desired or 0) > (n.applied or 0)]
    nacked = [n for n in behind if n.nack]
    if nacked:
        figure = "; ".join(f"{n.name} refused it: {n.nack}" for n in nacked)
        acks = Check("nack", "fail", figure)
    elif any(n.health == "up" for n in behind):
        acks = Check("nack", "wait", f"{len(behind)} of {len(nodes)} nodes have not acked yet")
    else:
        acks = Check("nack", "pass", f"{len(nodes)} nodes run it")
    failing, starting = [], 0
    for node in nodes:
        if node.reading is None:
            continue
        then = at_wave.get(node.name)
        for engine in node.reading.engines:
            restarts = int(engine.get("restarts") or 0)
            since = restarts - (then.restarts.get(engine["id"], 0) if then else 0)
            if engine.get("state") == "crash_loop" or since >= limits.max_restarts:
                reason = str(engine.get("reason") or "")[:200]
                failing.append(f"{engine['id']} on {node.name}: {engine.get('state')}, "
                               f"{since} restarts{': ' + reason if reason else ''}")  # fmt: skip
            elif engine.get("state") == "starting":
                starting += 1
    if failing:
        engines = Check("engines", "fail", "; ".join(failing))
    elif starting:
        engines = Check("engines", "wait", f"{starting} engines starting")
    else:
        engines = Check("engines", "pass", "every engine up")
    return [acks, engines]
