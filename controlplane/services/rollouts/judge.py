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

One tenant's traffic never rolls a change back: agents report, per model, the tenants with the most
answers that were not "ok" (then those with the most answers), and a rate check that fails is judged
again with the tenant that gave the most of what it counts left out on both sides (its answers and
its bad ones); it fails only if it fails both times, so the evidence must come from more than one
tenant. Where the others had too few answers to judge by (a fleet that one tenant's traffic is all
of), that tenant's answers are the evidence.

Nor does one tenant's load: a request that waited while another tenant held well over its
fair share of the model (agents/router/admission.py) is counted apart by the agent, its
refusal as "crowded" and its first token's time as `@crowded`; both are left out. TTFT with
an SLO is judged as a rate, the share of timed answers past the SLO, like the others.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from controlplane.schemas.rollout import RolloutChecks
from controlplane.services.rollouts.counts import REFUSALS, Counts, Reading, above, quantile

Verdict = Literal["pass", "fail", "wait"]

Z = 3.0  # standard errors past which a difference of shares is more than chance
Z_PASS = 2.0  # standard errors within which a difference must stay under the margin to pass
TAIL = 5  # observations a latency quantile leaves above it, at the least
BAND_MIN = 10  # a baseline's answers at a load, to compare the updated side's at that load


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
        # Only streamed answers are timed: a model answered in whole only is judged on its
        # rates once they have enough answers, not held up waiting for streams.
        few = new.answers < limits.min_requests
        for timed, slo in ((TTFT, ttft_slo), (ITL, itl_slo)):
            kind, histogram = timed.histogram, getattr(new, timed.histogram)
            if not (max(histogram.values(), default=0) or few):
                continue
            if slo is not None:
                checks.append(_slo_misses(f"{kind}_slo", model, new, base, label, limits,
                                          slo, timed))  # fmt: skip
            else:
                baseline = getattr(base, kind) if base is not None else None
                checks.append(_latency(f"{kind}_p99", model, histogram, baseline, label, limits))
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


Count = Callable[[Counts], int]


def _answers(counts: Counts) -> int:
    return counts.answers


def _rate(
    name: str, model: str, new: Counts, base: Counts | None, label: str,
    limits: RolloutChecks, count: Count, margin: float, total: Count = _answers,
    tenant_count: Callable[[dict[str, int]], int] | None = None, what: str = "answers",
) -> Check:  # fmt: skip
    """A share (`count` of `total`) against the baseline's. `tenant_count`: what a tenant's
    reported codes give of `count` (default: `count` of its codes alone)."""
    if total(new) < limits.min_requests:
        return Check(name, "wait", f"{total(new)} of {limits.min_requests} {what}", model)
    bad, figure = _worse(new, base, count, margin, total)
    figure += f" ({label}) of {total(new)} {what}"
    if not bad and not _ruled_out(new, base, count, margin, total):
        # too little yet to rule out harm past the margin: wait for more, never pass
        return Check(name, "wait", f"{figure}; too few yet to rule out {margin:.0%} more", model)
    if bad and new.tenants:  # again without the tenant that gave the most: never one alone
        of = tenant_count or (lambda codes: count(Counts(codes)))
        top = max(new.tenants, key=lambda t: of(new.tenants[t]))
        left = new.without(top)
        if total(left) >= limits.min_requests:  # others were served here: judge by theirs
            base_left = base.without(top) if base is not None else None
            bad, again = _worse(left, base_left, count, margin, total)
            figure += f"; without {top}, the most of them: {again}"
    return Check(name, "fail" if bad else "pass", figure, model)


@dataclass(frozen=True)
class Timed:
    """A latency the agents time per streamed answer: its histogram, and its per-tenant
    codes (agents/metrics.py): timed, past the SLO, crowded, crowded and past the SLO."""

    histogram: str
    timed: str
    slow: str
    crowded: str
    crowded_slow: str

    def total(self, counts: Counts) -> int:
        """Answers timed, less those of tenants left out and those that waited on another
        tenant's load (agents/router/admission.py: `crowded`)."""
        timed = max(getattr(counts, self.histogram).values(), default=0)
        timed -= counts.left_out.get(self.timed, 0) + counts.tenants_count(self.crowded)
        return max(0, timed)

    def past(self, slo_s: float) -> Count:
        """Those past the SLO, less the same left out."""

        def count(counts: Counts) -> int:
            past = round(above(getattr(counts, self.histogram), slo_s))
            past -= counts.left_out.get(self.slow, 0) + counts.tenants_count(self.crowded_slow)
            return max(0, past)

        return count

    def tenant_past(self, codes: dict[str, int]) -> int:
        return codes.get(self.slow, 0) - codes.get(self.crowded_slow, 0)


TTFT = Timed("ttft", "@timed", "@slow_ttft", "@crowded", "@crowded_slow")
ITL = Timed("itl", "@itl_timed", "@slow_itl", "@crowded_itl", "@crowded_slow_itl")


def _slo_misses(
    name: str, model: str, new: Counts, base: Counts | None, label: str,
    limits: RolloutChecks, slo_ms: int, timed: Timed,
) -> Check:  # fmt: skip
    """The share of timed answers past the route's SLO, as a rate like the others; one that
    does not pass is judged again at like load (`_at_like_load`)."""
    margin = limits.slo_miss_rate
    check = _rate(name, model, new, base, label, limits, timed.past(slo_ms / 1000), margin,
                  timed.total, timed.tenant_past, "timed answers")  # fmt: skip
    if check.verdict == "pass" or base is None or not new.bands or not base.bands:
        return check
    return _at_like_load(check, new, base, timed.histogram, limits)


def _at_like_load(
    check: Check, new: Counts, base: Counts, kind: str, limits: RolloutChecks
) -> Check:
    """A latency past the SLO judged again against the baseline's at the same load: each
    band of load the updated answers met (requests in flight per serving worker, when sent)
    against the baseline's answers in that band, its share past the SLO weighted as the
    updated answers are spread (a direct standardisation). Answers at loads the baseline
    never had (`BAND_MIN` answers) are not compared: a latency that rose with a load the
    change did not cause (one tenant's long streams) is not the change's. As every rate, it
    passes only once a rise past the margin is ruled out; too few compared is "wait"."""
    n = unlike = m = 0
    x = expected = 0.0
    for band, counts in new.bands.items():
        timed, slow = counts.get(f"{kind}_timed", 0), counts.get(f"{kind}_slow", 0)
        theirs = base.bands.get(band, {})
        base_timed = theirs.get(f"{kind}_timed", 0)
        if base_timed < BAND_MIN:
            unlike += timed
            continue
        n, x, m = n + timed, x + slow, m + base_timed
        expected += timed * theirs.get(f"{kind}_slow", 0) / base_timed
    figure = f"{check.figure}; at like load, "
    if n < limits.min_requests:
        figure += f"{n} answers ({unlike} met loads the baseline never had): wait"
        return Check(check.check, "wait", figure, check.model)
    margin, y = limits.slo_miss_rate, expected * m / n
    bad, shares = _shares_worse(x, n, y, m, margin)
    figure += f"{shares} of {n} ({unlike} at loads the baseline never had)"
    if bad:
        return Check(check.check, "fail", figure, check.model)
    if (x - expected) / n + Z_PASS * _se(x, n, y, m) <= margin:
        return Check(check.check, "pass", figure, check.model)
    return Check(check.check, "wait", f"{figure}; too few yet to rule out {margin:.0%} more",
                 check.model)  # fmt: skip


def _ruled_out(
    new: Counts, base: Counts | None, count: Count, margin: float, total: Count = _answers
) -> bool:
    """The updated share is, beyond chance (`Z_PASS` standard errors), not past the
    baseline's by the margin: what a wave must show to pass."""
    n, x = total(new), count(new)
    m, y = (total(base), count(base)) if base is not None else (0, 0)
    share, base_share = x / max(n, 1), (y / m if m else 0.0)
    return bool(share - base_share + Z_PASS * _se(x, n, y, m) <= margin)


def _worse(
    new: Counts, base: Counts | None, count: Count, margin: float, total: Count = _answers
) -> tuple[bool, str]:
    """The updated share past the baseline's by the margin, twice it, and more than chance
    explains: `Z` standard errors of the difference of two shares (`_se_apart`: one flagged
    and one clean answer added to each side, so that two clean sides still leave room for
    chance; without a baseline, as if it were the same size)."""
    n, x = total(new), count(new)
    m, y = (total(base), count(base)) if base is not None else (0, 0)
    return _shares_worse(x, n, y, m, margin)


def _shares_worse(x: float, n: int, y: float, m: int, margin: float) -> tuple[bool, str]:
    share = x / n if n else 0.0
    base_share = y / m if m else 0.0
    chance = Z * _se_apart(x, n, y, m)
    bad = share > base_share + max(margin, chance) and share > 2 * base_share
    return bad, f"{share:.1%} vs {base_share:.1%}"


def _se(x: float, n: int, y: float, m: int) -> float:
    """The standard error of a difference of two shares, x of n and y of m (pooled)."""
    pooled = (x + y + 1) / (n + m + 2)
    return math.sqrt(pooled * (1 - pooled) * (1 / max(n, 1) + 1 / max(m or n, 1)))


def _se_apart(x: float, n: int, y: float, m: int) -> float:
    """The same as Agresti and Caffo's interval has it: each side's own spread, with one
    flagged and one clean answer added to each; what a rollback must be beyond. (The pooled
    share understates a small side's spread where the baseline's is near zero: one refusal
    in 14 answers against none in 300 came out past 3 standard errors, and rolled a harmless
    change back. A pass keeps the pooled one: it asks for a share well under the margin.)"""
    if not m:  # no baseline: as if it were the same size
        m, y = n, 0
    new, base = (x + 1) / (n + 2), (y + 1) / (m + 2)
    return math.sqrt(new * (1 - new) / (n + 2) + base * (1 - base) / (m + 2))


def _latency(
    name: str, model: str, new: dict[float, int], base: dict[float, int] | None,
    label: str, limits: RolloutChecks,
) -> Check:  # fmt: skip
    """A route without an SLO for it: a high quantile against the baseline's, the 99th where
    at least `TAIL` observations lie above it, else the highest that leaves `TAIL` above (a
    p99 of 35 answers is their slowest one, which one answer makes). Without a baseline it
    is not judged."""
    observed = max(new.values(), default=0)
    if observed < limits.min_requests:
        return Check(name, "wait", f"{observed} of {limits.min_requests} timed", model)
    q = min(0.99, 1 - TAIL / observed)
    p = (quantile(new, q) or 0.0) * 1000
    if base is None or max(base.values(), default=0) < limits.min_requests:
        return Check(name, "pass", f"p{q * 100:.0f} {p:.0f} ms (no baseline); no SLO", model)
    base_p = (quantile(base, q) or 0.0) * 1000
    figure = f"p{q * 100:.0f} {p:.0f} ms vs {base_p:.0f} ms ({label}) of {observed}; no SLO"
    worse = p > limits.latency_ratio * max(base_p, 1.0)
    return Check(name, "fail" if worse else "pass", figure, model)


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
