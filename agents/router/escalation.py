"""Escalation: when a region sends a request to a peer, and to which one. Decisions only.

A region escalates only on overload (its predicted time to first token breaks the threshold,
or too many requests of the model wait) or failure (no worker serves, every attempt failed, or
its attempts fail more often than the rule allows). The candidates are the peers of the
matching fallback chain that serve the model, that the tenant's jurisdictions allow, and that
are not known to be unhealthy; the one with the lowest predicted TTFT including the round trip
wins, ties (within 50 ms) going to the chain's order. A peer not yet measured is taken to be as
far as the measured ones are on average, and to have no wait.

What a peer is like comes from its own answers: each gateway says its load in every answer
(`endpoint-load-metrics`, after Envoy's ORCA), and the round trip is measured per forwarded
request (its `Server-Timing` says how long the peer itself took). A passive breaker per peer
opens on failures and half-opens to probe, as a worker's does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from agents.books import Books
from agents.config import FallbackChain, Peer
from agents.held import Held
from agents.router.breaker import Breaker

LOAD_HEADER = "endpoint-load-metrics"


def tries_another(status: int) -> bool:
    """Whether a region that escalated a request tries its next peer when one answers
    `status` before any byte of its answer: it is full (429, 503) or failed (5xx). Any other
    answer is relayed to the client as the peer's."""
    return status in (429, 503) or status >= 500


FRESH_S = 10.0  # a peer's reported load is believed this long
RTT_WEIGHT = 0.3  # of a new round trip in the peer's smoothed one
ERROR_WEIGHT = 0.05  # of a local attempt in the model's smoothed failure share
FULL_MAX_S = 0.5  # the longest a peer that said it is full is passed over: its queue moves
# faster than the Retry-After it tells clients
TIE_S = 0.05  # predictions this close are a tie, which the chain's order breaks


@dataclass
class PeerView:
    region: str
    breaker: Breaker = field(default_factory=Breaker)
    health: str = "unknown"  # the control plane's, as of the snapshot: seconds old
    rtt_s: float | None = None
    last_ok: float = float("-inf")
    ttft: dict[str, tuple[float, float]] = field(default_factory=dict)  # model: (s, when)
    full_until: dict[str, float] = field(default_factory=dict)  # model: when it may be tried
    inflight: int = 0  # requests sent there from this gateway, not yet ended

    def predicted_s(self, model: str, now: float, rtt_s: float) -> float:
        """Its reported TTFT while fresh (else none known), plus the round trip (`rtt_s` when
        none is measured yet)."""
        reported, at = self.ttft.get(model, (0.0, float("-inf")))
        rtt = self.rtt_s if self.rtt_s is not None else rtt_s
        return (reported if now - at <= FRESH_S else 0.0) + rtt

    def usable(self, model: str, now: float) -> bool:
        if self.full_until.get(model, 0.0) > now:
            return False
        if self.health == "down" and now - self.last_ok > FRESH_S:
            return False  # down by the control plane's account, and nothing newer says not
        return self.breaker.allows(now)


class PeerTry(Held):
    """See `Escalations.sending`."""

    __slots__ = ("view",)

    def __init__(self, view: PeerView) -> None:
        super().__init__()
        self.view = view

    def release(self, error: BaseException | None) -> None:
        self.view.inflight -= 1
        # the peer's answer (or its failure) ended a probe already; a try that ended
        # otherwise (cancelled, an exception of ours) ends it without a verdict
        self.view.breaker.abandoned(self)


@dataclass(frozen=True)
class PeerChoice:
    peer: Peer
    predicted_s: float


class Escalations:
    def __init__(
        self, clock: Callable[[], float] = time.monotonic, books: Books | None = None
    ) -> None:
        self.clock = clock
        self.books = books if books is not None else Books()  # the escalations in and out
        self.peers: dict[str, PeerView] = {}
        self.error_share: dict[str, float] = {}  # model: smoothed share of failed attempts

    def configure(self, regions: Iterable[str], health: Mapping[str, str]) -> None:
        """The peers of the new snapshot; a peer known before keeps what is known of it."""
        self.peers = {r: self.peers.get(r) or PeerView(r) for r in regions}
        for region, view in self.peers.items():
            view.health = health.get(region, "unknown")

    def failing(self, chain: FallbackChain, model: str) -> bool:
        """Local attempts fail more often than the rule allows."""
        limit = chain.error_rate
        return limit is not None and self.error_share.get(model, 0.0) > limit

    def attempted(self, model: str, ok: bool) -> None:
        share = self.error_share.get(model, 0.0)
        self.error_share[model] = share + ERROR_WEIGHT * ((0.0 if ok else 1.0) - share)

    def candidates(
        self, chain: FallbackChain, model: str, jurisdictions: frozenset[str] | None
    ) -> list[PeerChoice]:
        now = self.clock()
        known = [v.rtt_s for v in self.peers.values() if v.rtt_s is not None]
        typical_rtt = sum(known) / len(known) if known else 0.0
        ranked: list[tuple[int, int, PeerChoice]] = []
        for order, peer in enumerate(chain.peers):
            if peer.gateway_url is None or model not in peer.models:
                continue
            if jurisdictions is not None and peer.jurisdiction not in jurisdictions:
                continue  # residency: never served outside the tenant's jurisdictions
            view = self.peers.get(peer.region)
            if view is None or not view.usable(model, now):
                continue
            predicted = view.predicted_s(model, now, typical_rtt)
            ranked.append((int(predicted / TIE_S), order, PeerChoice(peer, predicted)))
        ranked.sort(key=lambda item: item[:2])
        return [choice for _, _, choice in ranked]

    def still_usable(self, region: str, model: str) -> bool:
        """A candidate chosen before an earlier one was tried may be tried still: its breaker
        may have opened, or another request may have taken its one half-open probe, since."""
        view = self.peers.get(region)
        return view is None or view.usable(model, self.clock())

    def sending(self, region: str, reason: str) -> PeerTry:
        """One request's try of a peer, held by `with`: it counts in the peer's in-flight
        requests, and probes a half-open peer, until the block ends, however it ends."""
        self.books.escalations["out", region, reason] += 1
        view = self.peers.get(region)
        if view is None:  # a snapshot dropped the peer: its try is counted nowhere
            view = PeerView(region)
        held = PeerTry(view)
        view.breaker.dispatched(held)
        view.inflight += 1
        return held

    def received(self, region: str, reason: str) -> None:
        self.books.escalations["in", region, reason] += 1

    def answered(
        self,
        region: str,
        model: str,
        *,
        status: int,
        elapsed_s: float,
        load: str | None,
        server_s: float | None,
        retry_after_s: float | None = None,
    ) -> None:
        """A peer's answer came (its head): what it says of its load, and the round trip."""
        view = self.peers.get(region)
        if view is None:
            return
        now = self.clock()
        rtt = max(0.0, elapsed_s - server_s) if server_s is not None else elapsed_s
        view.rtt_s = rtt if view.rtt_s is None else view.rtt_s + RTT_WEIGHT * (rtt - view.rtt_s)
        ttft = parse_load(load).get("ttft_ms") if load else None
        if ttft is not None:
            view.ttft[model] = (ttft / 1000, now)
        if status >= 500 and status != 503:
            view.breaker.failed(now)
            return
        view.last_ok = now
        view.breaker.succeeded()
        if status in (429, 503):  # it is full, or has no worker for the model: not for now
            view.full_until[model] = now + min(FULL_MAX_S, retry_after_s or 1.0)

    def unreachable(self, region: str) -> None:
        view = self.peers.get(region)
        if view is not None:
            view.breaker.failed(self.clock())

    def status(self) -> dict[str, object]:
        now = self.clock()
        return {
            "peers": {
                r: {"breaker": str(v.breaker.state), "health": v.health, "inflight": v.inflight,
                    "rtt_ms": round(v.rtt_s * 1000, 2) if v.rtt_s is not None else None,
                    "ttft_ms": {m: round(t * 1000, 1) for m, (t, at) in v.ttft.items()
                                if now - at <= FRESH_S}}
                for r, v in sorted(self.peers.items())
            },
            "counts": [{"direction": d, "peer": p, "reason": r, "count": n}
                       for d, p, r, n in self.report()],
        }  # fmt: skip

    def report(self) -> list[tuple[str, str, str, int]]:
        return [(d, p, r, n) for (d, p, r), n in sorted(self.books.escalations.items())]


def load_header(ttft_s: float | None, waiting: int, serving: int) -> str:
    """What a gateway says of its load, for the model of the answer, in ORCA's text form."""
    ttft = f"named_metrics.ttft_ms={ttft_s * 1000:.1f}, " if ttft_s is not None else ""
    return f"TEXT {ttft}named_metrics.waiting={waiting}, named_metrics.serving={serving}"


def parse_load(header: str) -> dict[str, float]:
    metrics: dict[str, float] = {}
    _, _, body = header.partition(" ")
    for item in body.split(","):
        name, _, value = item.strip().partition("=")
        try:
            metrics[name.removeprefix("named_metrics.")] = float(value)
        except ValueError:
            continue
    return metrics
