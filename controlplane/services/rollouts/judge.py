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
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar

from controlplane.schemas.rollout import RolloutChecks

Z = 3.0  # standard errors past which a difference of shares is more than chance
Z_PASS = 2.0  # standard errors within which a difference must stay under the margin to pass
ERRORS = frozenset({"internal_error", "upstream_failed", "no_healthy_worker", "not_ready"})
# not quota_exceeded, tenant_concurrency or tenant_share: a tenant's own limits, and its
# requests over its fair share of a saturated model (agents/gateway/admission.py)
REFUSALS = frozenset({"queue_full", "overloaded"})
Verdict = Literal["pass", "fail", "wait"]
K = TypeVar("K", str, float)


@dataclass
class Counts:
    """What a node's gateway answered for one model, over some window."""

    codes: dict[str, int] = field(default_factory=dict)
    escalated: int = 0
    ttft: dict[float, int] = field(default_factory=dict)  # cumulative, by upper bound
    itl: dict[float, int] = field(default_factory=dict)
    # the tenants that had answers that were not "ok": tenant: {"": answers, code: count}
    tenants: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def answers(self) -> int:
        return sum(self.codes.values())

    def of(self, codes: frozenset[str]) -> int:
        return sum(n for c, n in self.codes.items() if c in codes)

    def errors(self) -> int:
        return sum(n for c, n in self.codes.items() if c in ERRORS or _is_5xx(c))

    def add(self, other: Counts) -> None:
        self.codes = _plus(self.codes, other.codes)
        self.ttft, self.itl = _plus(self.ttft, other.ttft), _plus(self.itl, other.itl)
        self.escalated += other.escalated
        for tenant, codes in other.tenants.items():
            self.tenants[tenant] = _plus(self.tenants.get(tenant, {}), codes)

    def without(self, tenant: str) -> Counts:
        """These counts with one tenant's answers left out."""
        theirs = self.tenants.get(tenant, {})
        codes = {c: max(0, n - theirs.get(c, 0)) for c, n in self.codes.items()}
        left = self.answers - theirs.get("", 0)
        codes["ok"] = max(0, codes.get("ok", 0) - max(0, sum(codes.values()) - left))
        others = {t: c for t, c in self.tenants.items() if t != tenant}
        return Counts(codes, self.escalated, self.ttft, self.itl, others)

    def minus(self, then: Counts) -> Counts:
        """What happened since `then`; all of it when a counter went back (a restart)."""
        went_back = (
            self.escalated < then.escalated
            or _went_back(self.codes, then.codes)
            or _went_back(self.ttft, then.ttft)
            or _went_back(self.itl, then.itl)
        )
        if went_back:
            return self
        tenants = {t: {c: n for c, n in _plus(codes, then.tenants.get(t, {}), -1).items() if n > 0}
                   for t, codes in self.tenants.items()}  # fmt: skip
        return Counts(
            _plus(self.codes, then.codes, -1),
            self.escalated - then.escalated,
            _plus(self.ttft, then.ttft, -1),
            _plus(self.itl, then.itl, -1),
            {t: c for t, c in tenants.items() if c},
        )

    def as_json(self) -> dict[str, Any]:
        """JSON-ready: bounds as strings, as JSON has no infinity."""
        return {
            "codes": self.codes,
            "escalated": self.escalated,
            "ttft": [[str(le), n] for le, n in sorted(self.ttft.items())],
            "itl": [[str(le), n] for le, n in sorted(self.itl.items())],
            "tenants": self.tenants,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Counts:
        return cls(
            {k: int(v) for k, v in doc.get("codes", {}).items()},
            int(doc.get("escalated", 0)),
            {float(le): int(n) for le, n in doc.get("ttft", [])},
            {float(le): int(n) for le, n in doc.get("itl", [])},
            {t: {c: int(n) for c, n in codes.items()}
             for t, codes in (doc.get("tenants") or {}).items()},
        )  # fmt: skip


def _plus(a: dict[K, int], b: dict[K, int], sign: int = 1) -> dict[K, int]:
    return {k: a.get(k, 0) + sign * b.get(k, 0) for k in a.keys() | b.keys()}


def _went_back(now: dict[K, int], then: dict[K, int]) -> bool:
    return any(now.get(k, 0) < n for k, n in then.items())


def _is_5xx(code: str) -> bool:
    return code.startswith("http_5")


@dataclass
class Reading:
    """One node's heartbeat, as the checks need it: counts per model, engine restarts."""

    models: dict[str, Counts] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    engines: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_telemetry(cls, doc: dict[str, Any]) -> Reading:
        models = {}
        for answers in doc.get("answers", []):
            histograms = [answers.get(k) or {} for k in ("ttft", "itl")]
            ttft, itl = ({float(le): int(n) for le, n in zip(h.get("le", []), h.get("count", []),
                                                               strict=False)}
                         for h in histograms)  # fmt: skip
            tenants = {str(t.get("tenant", "")): {"": int(t.get("total") or 0)} | {
                c: int(n) for c, n in (t.get("by_code") or {}).items()}
                for t in answers.get("tenants") or []}  # fmt: skip
            models[answers["model"]] = Counts(
                {k: int(v) for k, v in (answers.get("total_by_code") or {}).items()},
                int(answers.get("escalated_total") or 0), ttft, itl, tenants,
            )  # fmt: skip
        engines = list(doc.get("engines", []))
        return cls(models, {e["id"]: int(e.get("restarts") or 0) for e in engines}, engines)

    def as_json(self) -> dict[str, Any]:
        return {"models": {m: c.as_json() for m, c in self.models.items()},
                "restarts": self.restarts}  # fmt: skip

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Reading:
        return cls({m: Counts.from_json(c) for m, c in doc.get("models", {}).items()},
                   {k: int(v) for k, v in doc.get("restarts", {}).items()})  # fmt: skip

    def minus(self, then: Reading | None) -> dict[str, Counts]:
        if then is None:
            return self.models
        return {m: c.minus(then.models.get(m, Counts())) for m, c in self.models.items()}


def total(windows: list[dict[str, Counts]]) -> dict[str, Counts]:
    out: dict[str, Counts] = {}
    for window in windows:
        for model, counts in window.items():
            out.setdefault(model, Counts()).add(counts)
    return out


def quantile(buckets: dict[float, int], q: float) -> float | None:
    """Prometheus' histogram_quantile: linear within the bucket; None without observations."""
    ordered = sorted(buckets.items())
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank, lower, below = q * ordered[-1][1], 0.0, 0
    for le, count in ordered:
        if count >= rank:
            if le == float("inf"):
                return lower
            span = count - below
            return lower + (le - lower) * ((rank - below) / span if span else 1.0)
        lower, below = le, count
    return lower


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


def above(buckets: dict[float, int], bound: float) -> float:
    """Observations of a cumulative histogram above `bound` (linear within its bucket)."""
    ordered = sorted(buckets.items())
    if not ordered:
        return 0.0
    total, lower, below = ordered[-1][1], 0.0, 0
    for le, count in ordered:
        if bound < le:
            if le == float("inf"):
                return float(total - below)
            at = below + (count - below) * (bound - lower) / (le - lower)
            return total - at
        lower, below = le, count
    return 0.0


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
