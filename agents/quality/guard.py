"""Quarantine: which workers the region routes around because of what they say, and why.
No I/O; the agent feeds it findings and canary verdicts and reads its events.

- A worker is quarantined when it fails `FAILS_IN_ROW` canaries in a row, or a detector
  fails against its peers (`peers.Finding`) while its canaries do not pass. It stays up and
  keeps getting canaries; after `PASSES_IN_ROW` passes in a row it is readmitted, and the
  answers' records of its model's workers all start anew (what it said before is not held
  against it again, and its peers' records hold nothing it is not compared with).
- The canaries are the ground truth: no tenant controls them. A worker whose last canary
  passed is never quarantined on its answers alone (a tenant can make answers look bad); it
  is alerted on, once, until a review finds nothing against it.
- The last worker of a model in the region that is not quarantined is never quarantined:
  the region would have nothing to serve the model with. An alert is raised instead, and
  the region's fallback rules decide whether its requests go to a peer.
- Every change is an event with its evidence: the detector or canary, the worker's figure
  against its peers', and example request ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from meridian_pb.fleet.v1.judging import Verdict

from agents.quality.peers import Book, Finding

FAILS_IN_ROW = 2
PASSES_IN_ROW = 3


@dataclass(frozen=True, slots=True)
class Event:
    kind: Literal["quarantined", "readmitted", "alert"]
    worker: str
    model: str
    check: str  # a detector's name, or "canary:<name>"
    figure: float  # the worker's share flagged, or its canary score
    peers_figure: float  # the peers' share, or the least score that passes
    examples: tuple[str, ...] = ()
    at: float = 0.0
    note: str = ""  # why it is what it is, where that is not plain (the agent's status)


@dataclass
class _Worker:
    model: str
    quarantined: bool = False
    alerted: bool = False
    fails: int = 0
    passes: int = 0
    slow: bool = False  # alerted on for its latency, until it is back within bounds
    suspected: bool = False  # alerted on for its answers while its canaries pass

    @property
    def held(self) -> bool:
        """Quarantined or alerted on now."""
        return self.quarantined or self.alerted or self.suspected


@dataclass
class Guard:
    book: Book = field(default_factory=Book)
    workers: dict[str, _Worker] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)

    def set_workers(self, models: Mapping[str, str]) -> None:
        """The region's workers and their models, from the snapshot; the rest forgotten."""
        for worker, model in models.items():
            known = self.workers.get(worker)
            if known is None or known.model != model:
                self.workers[worker] = _Worker(model)
        for gone in [w for w in self.workers if w not in models]:
            del self.workers[gone]
        self.book.forget(models)

    @property
    def quarantined(self) -> frozenset[str]:
        return frozenset(w for w, s in self.workers.items() if s.quarantined)

    def findings(self, found: Iterable[Finding], now: float) -> None:
        """A review's findings: each worker's failed detectors (all of them, each review)."""
        named = set()
        for f in found:
            named.add(f.worker)
            event = Event("quarantined", f.worker, "", f.detector, f.share, f.peers_share,
                          f.examples, now)  # fmt: skip
            state = self.workers.get(f.worker)
            if state is not None and state.passes > 0:  # its last canary passed
                if not state.suspected and not state.quarantined:
                    state.suspected = True
                    note = "its canaries pass: alerted on, not quarantined on answers alone"
                    self.events.append(replace(event, kind="alert", model=state.model,
                                               note=note))  # fmt: skip
                continue
            self._fail(f.worker, event)
        for worker, state in self.workers.items():
            if worker not in named:
                state.suspected = False

    def canary(self, name: str, verdicts: Iterable[Verdict], now: float) -> None:
        for v in verdicts:
            state = self.workers.get(v.worker)
            if state is None:
                continue
            if v.passed:
                state.fails, state.passes = 0, state.passes + 1
                if state.passes >= PASSES_IN_ROW:
                    if state.quarantined:
                        self._readmit(v.worker, f"canary:{name}", v, now)
                    state.alerted = False  # well again: a new failure alerts anew
                continue
            state.passes, state.fails = 0, state.fails + 1
            if state.fails >= FAILS_IN_ROW:
                self._fail(v.worker, Event("quarantined", v.worker, "", f"canary:{name}",
                                           v.score, v.bound, (), now))  # fmt: skip

    def latency(self, worker: str, figure: float, peers: float, bound: float, now: float) -> None:
        """A worker's time per token against its peers' at the same batch: past `bound`
        times theirs it is alerted on once (not quarantined: a slower worker answers right,
        and the router already sends it less); back under half the bound, it may be again."""
        state = self.workers.get(worker)
        if state is None:
            return
        if not state.slow and figure > bound * peers:
            state.slow = True
            self.events.append(Event("alert", worker, state.model, "latency", figure, peers,
                                     (), now))  # fmt: skip
        elif state.slow and figure < bound * peers / 2:
            state.slow = False

    def _fail(self, worker: str, event: Event) -> None:
        state = self.workers.get(worker)
        if state is None or state.quarantined:
            return
        event = replace(event, model=state.model)
        serving = [w for w, s in self.workers.items()
                   if s.model == state.model and not s.quarantined]  # fmt: skip
        if serving == [worker]:  # the model's last: alert once, keep serving
            if not state.alerted:
                state.alerted = True
                self.events.append(replace(event, kind="alert"))
            return
        state.quarantined, state.passes = True, 0
        self.events.append(event)

    def _readmit(self, worker: str, check: str, verdict: Verdict, now: float) -> None:
        state = self.workers[worker]
        state.quarantined = state.alerted = False
        state.fails = 0  # its passes stand: its canaries pass
        # its model's records start anew: its own, and its peers' it is compared with
        self.book.forget(w for w, s in self.workers.items() if s.model != state.model)
        self.events.append(Event("readmitted", worker, state.model, check, verdict.score,
                                 verdict.bound, (), now))  # fmt: skip
