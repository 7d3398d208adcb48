"""The quality guard in the gateway: every ended answer of an engine read by the detectors
(on the event loop, once, after the client has it), and a review each second, off the
request path, that quarantines or readmits workers in the worker table and logs each event
with its evidence. What it holds goes to the agent's status, its metrics and the heartbeat
(the region's figures per model, which the control plane compares across regions)."""

from __future__ import annotations

import hashlib
import logging
import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

from meridian_pb.fleet.v1.judging import DETECTORS, Verdict

from agents.books import Books
from agents.quality.canary import Canary
from agents.quality.detectors import Answer, suspect
from agents.quality.guard import Event, Guard
from agents.quality.peers import PREFIX_BYTES, Source
from agents.router import predict
from agents.router.view import WorkerView
from agents.workers.table import WorkerTable

log = logging.getLogger(__name__)
RECENT = 50  # events kept for the agent's status
SLOW = 4.0  # times the peers' time per token, at the same batch: a worker alerted on
MIN_LEARNED = 20  # answers behind a worker's learned speed before it is compared


class Quality:
    def __init__(
        self,
        table: WorkerTable,
        views: Mapping[str, WorkerView] | None = None,
        clock: Callable[[], float] = time.time,
        books: Books | None = None,
    ) -> None:
        self.table = table
        self.books = books if books is not None else Books()  # its events, counted
        self.views = views if views is not None else {}  # the router's, for latency
        self.clock = clock  # wall clock: events carry when they happened
        self.guard = Guard()
        self.recent: deque[Event] = deque(maxlen=RECENT)
        self.unsent: list[Event] = []  # for the next heartbeat
        # (model, canary): the digest of its reference, and the last score of each worker
        self.scores: dict[tuple[str, str], tuple[str, dict[str, float]]] = {}

    def observe(
        self,
        worker: str,
        request_id: str,
        answer: Answer | None,
        prompt: Callable[[], str],
        key: bytes,
        tenant: str,
    ) -> None:
        """One ended answer of `worker`, to a request of `tenant`'s: `prompt`, its prompt's
        text (made only if a detector asks for it); `key`, the prompt as the prefix index
        keys it."""
        if answer is None:
            return
        flags = suspect(answer, prompt)
        source = Source(tenant, hash(key[:PREFIX_BYTES]))
        self.guard.book.record(worker, flags, request_id, source)

    def canary(self, model: str, canary: Canary, verdicts: list[Verdict]) -> None:
        """A round of one canary on the model's workers that had room for it."""
        digest = hashlib.sha256(canary.reference.encode()).hexdigest()[:16]
        key = (model, canary.name)
        known = self.scores.get(key)
        scores = known[1] if known is not None and known[0] == digest else {}
        scores.update((v.worker, v.score) for v in verdicts)
        self.scores[key] = (digest, scores)
        self.guard.canary(canary.name, verdicts, self.clock())
        self.review()

    def review(self) -> None:
        """Judge every worker against its peers: the same model, deployment and role."""
        entries = self.table.entries
        self.guard.set_workers({w: e.spec.model for w, e in entries.items()})
        # peers: the same model, deployment (its revision and quantization, its engine
        # arguments) and hardware; a worker held out is no one's peer, and not judged
        kinds = {w: f"{e.spec.model}/{e.spec.deployment}/{e.spec.role}/{e.spec.hardware}"
                 + ("/held" if e.quarantined else "") for w, e in entries.items()}  # fmt: skip
        self.guard.findings(self.guard.book.findings(kinds), self.clock())
        self._latency(kinds)
        self.table.set_quarantined(self.guard.quarantined)
        events, self.guard.events = self.guard.events, []
        for event in events:
            self.recent.append(event)
            self.unsent.append(event)
            self.books.quality[event.model, event.worker, event.kind, event.check] += 1
            log.warning(
                "quality: %s %s (%s): %s %.3g against its peers' %.3g; e.g. %s%s",
                event.worker, event.kind, event.model, event.check, event.figure,
                event.peers_figure, ", ".join(event.examples) or "-",
                f" ({event.note})" if event.note else "",
            )  # fmt: skip
        del self.unsent[:-RECENT]

    def _latency(self, kinds: Mapping[str, str]) -> None:
        """Each worker's time per token at batch 1, as the router learned it from its
        answers, against its peers' of the same kind: load is taken out by comparing at
        the same batch."""
        steps: dict[str, dict[str, float]] = {}
        for worker, kind in kinds.items():
            view = self.views.get(worker)
            if view is not None and view.learned >= MIN_LEARNED:
                steps.setdefault(kind, {})[worker] = predict.step_at(view, 1.0)
        now = self.clock()
        for mine in steps.values():
            for worker, step in mine.items():
                peers = [s for w, s in mine.items() if w != worker]
                if peers:
                    self.guard.latency(worker, step, statistics.median(peers), SLOW, now)

    def take_unsent(self) -> list[Event]:
        """The events since the last heartbeat took them."""
        events, self.unsent = self.unsent, []
        return events

    def held(self) -> dict[str, Event]:
        """Each worker quarantined or alerted on now, with the event that put it there."""
        out: dict[str, Event] = {}
        for event in self.recent:  # oldest first: the last word stands
            if event.check != "latency":  # an alert of its speed holds nothing
                out[event.worker] = event
        states = self.guard.workers
        return {w: e for w, e in out.items()
                if w in states and e.kind != "readmitted" and states[w].held}  # fmt: skip

    def unreliable(self) -> set[str]:
        """Workers that are no reference for others: quarantined, or alerted on as their
        model's last (it failed a check too; there was just no one to take its place)."""
        return {w for w, s in self.guard.workers.items() if s.quarantined or s.alerted}

    def held_states(self) -> dict[tuple[str, str], str]:
        """(model, worker): quarantined or alert, for the workers held now."""
        return {(e.model, w): "alert" if e.kind == "alert" else "quarantined"
                for w, e in self.held().items()}  # fmt: skip

    def models(self) -> dict[str, dict[str, Any]]:
        """Per model, the region's figures for the control plane to compare across regions:
        of the last answers of its workers in rotation, the share each detector flagged, and
        each canary's median score over them with the digest of its reference."""
        entries = self.table.entries
        out: dict[str, dict[str, Any]] = {}
        for model in sorted({e.spec.model for e in entries.values()}):
            rotation = [w for w, e in entries.items()
                        if e.spec.model == model and not e.quarantined]  # fmt: skip
            answers, flagged = self.guard.book.totals(rotation)
            canaries = []
            for (m, name), (digest, scores) in sorted(self.scores.items()):
                mine = [s for w, s in scores.items() if m == model and w in rotation]
                if mine:
                    canaries.append({"name": name, "reference": digest, "workers": len(mine),
                                     "score": round(statistics.median(mine), 4)})  # fmt: skip
            out[model] = {"answers": answers, "flagged": flagged, "canaries": canaries}
        return out

    def status(self) -> dict[str, Any]:
        return {
            "held": [_event(e) for e in self.held().values()],
            "events": [_event(e) for e in self.recent],
            "models": self.models(),
            "detectors": list(DETECTORS),
        }


def _event(event: Event) -> dict[str, Any]:
    return asdict(event) | {"examples": list(event.examples)}
