"""What a node's gateway answered for each model, as the rollout's checks read it: answers by code,
answers a peer gave, TTFT and ITL histograms, the tenants with the most answers that were not "ok"
(then the most answers), and timed answers by the load they met, all cumulative since the gateway
started, so that the difference between two heartbeats is what happened in between. No I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

ERRORS = frozenset({"internal_error", "upstream_failed", "no_healthy_worker", "not_ready"})
# not quota_exceeded, tenant_concurrency or tenant_share: a tenant's own limits, and its
# requests over its fair share of a saturated model (agents/router/admission.py)
REFUSALS = frozenset({"queue_full", "overloaded"})
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
    # the counts of tenants left out (`without`): what the histograms still hold of theirs
    left_out: dict[str, int] = field(default_factory=dict)
    # streamed answers timed by the load they met: band: {"ttft_timed": n, "ttft_slow": n,
    # "itl_timed": n, "itl_slow": n} (agents/metrics.py: load_band)
    bands: dict[int, dict[str, int]] = field(default_factory=dict)
    # of `codes`, the answers to requests a peer region escalated here
    received: dict[str, int] = field(default_factory=dict)
    # every tenant with answers is in `tenants` (none before a first heartbeat: all of none)
    tenants_all: bool = True

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
        for band, counts in other.bands.items():
            self.bands[band] = _plus(self.bands.get(band, {}), counts)
        self.received = _plus(self.received, other.received)
        self.tenants_all = self.tenants_all and other.tenants_all

    def without(self, tenant: str) -> Counts:
        """These counts with one tenant's answers left out."""
        theirs = self.tenants.get(tenant, {})
        codes = {c: max(0, n - theirs.get(c, 0)) for c, n in self.codes.items()}
        left = self.answers - theirs.get("", 0)
        codes["ok"] = max(0, codes.get("ok", 0) - max(0, sum(codes.values()) - left))
        others = {t: c for t, c in self.tenants.items() if t != tenant}
        return Counts(codes, self.escalated, self.ttft, self.itl, others,
                      _plus(self.left_out, theirs), self.bands, self.received,
                      self.tenants_all)  # fmt: skip

    def tenants_count(self, code: str) -> int:
        """A code's count over the tenants reported (and not left out)."""
        return sum(codes.get(code, 0) for codes in self.tenants.values())

    def minus(self, then: Counts) -> Counts:
        """What happened since `then`; all of it when a counter went back (a restart). A
        tenant `then` did not tell had no answers then if it told every tenant; else what it
        had is unknown, and the tenant is not told for the window (its answers since the
        start are not the window's)."""
        went_back = (
            self.escalated < then.escalated
            or _went_back(self.codes, then.codes)
            or _went_back(self.ttft, then.ttft)
            or _went_back(self.itl, then.itl)
            or _went_back(self.received, then.received)
        )
        if went_back:
            return self
        tenants = {t: {c: n for c, n in _plus(codes, then.tenants.get(t, {}), -1).items() if n > 0}
                   for t, codes in self.tenants.items()
                   if t in then.tenants or then.tenants_all}  # fmt: skip
        bands = {b: {k: n for k, n in _plus(c, then.bands.get(b, {}), -1).items() if n > 0}
                 for b, c in self.bands.items()}  # fmt: skip
        return Counts(
            _plus(self.codes, then.codes, -1),
            self.escalated - then.escalated,
            _plus(self.ttft, then.ttft, -1),
            _plus(self.itl, then.itl, -1),
            {t: c for t, c in tenants.items() if c},
            bands={b: c for b, c in bands.items() if c},
            received={c: n for c, n in _plus(self.received, then.received, -1).items() if n},
            tenants_all=self.tenants_all and len(tenants) == len(self.tenants),
        )

    def as_json(self) -> dict[str, Any]:
        """JSON-ready: bounds as strings, as JSON has no infinity."""
        return {
            "codes": self.codes,
            "escalated": self.escalated,
            "ttft": [[str(le), n] for le, n in sorted(self.ttft.items())],
            "itl": [[str(le), n] for le, n in sorted(self.itl.items())],
            "tenants": self.tenants,
            "bands": {str(b): c for b, c in self.bands.items()},
            "received": self.received,
            "tenants_all": self.tenants_all,
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
            bands={int(b): {k: int(n) for k, n in c.items()}
                   for b, c in (doc.get("bands") or {}).items()},
            received={k: int(v) for k, v in (doc.get("received") or {}).items()},
            tenants_all=bool(doc.get("tenants_all", False)),
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
            bands = {int(b.get("band") or 0): {k: int(n) for k, n in b.items() if k != "band"}
                     for b in answers.get("bands") or []}  # fmt: skip
            models[answers["model"]] = Counts(
                {k: int(v) for k, v in (answers.get("total_by_code") or {}).items()},
                int(answers.get("escalated_total") or 0), ttft, itl, tenants, bands=bands,
                received={k: int(v) for k, v in (answers.get("received_by_code") or {}).items()},
                tenants_all=bool(answers.get("tenants_all", False)),
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
