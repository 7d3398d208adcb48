"""The quality guard in the gateway: every ended answer of an engine read by the detectors
(on the event loop, once, after the client has it), and a review each second, off the
request path, that quarantines or readmits workers in the worker table and logs each event
with its evidence."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from agents.gateway.requests import Inference
from agents.quality.answers import prompt_text
from agents.quality.canary import Verdict
from agents.quality.detectors import Answer, suspect
from agents.quality.guard import Event, Guard
from agents.workers.table import WorkerTable

log = logging.getLogger(__name__)
RECENT = 50  # events kept for the agent's status


class Quality:
    def __init__(self, table: WorkerTable, clock: Callable[[], float] = time.monotonic) -> None:
        self.table = table
        self.clock = clock
        self.guard = Guard()
        self.recent: deque[Event] = deque(maxlen=RECENT)

    def observe(
        self, worker: str, request_id: str, answer: Answer | None, inference: Inference
    ) -> None:
        """One ended answer of `worker`."""
        if answer is None:
            return
        flags = suspect(answer, lambda: prompt_text(inference))
        self.guard.book.record(worker, flags, request_id)

    def canary(self, name: str, verdicts: list[Verdict]) -> None:
        """A round of one canary on the workers that had room for it."""
        self.guard.canary(name, verdicts, self.clock())
        self.review()

    def review(self) -> None:
        """Judge every worker against its peers: the same model, deployment and role."""
        entries = self.table.entries
        self.guard.set_workers({w: e.spec.model for w, e in entries.items()})
        kinds = {w: f"{e.spec.model}/{e.spec.deployment}/{e.spec.role}"
                 for w, e in entries.items()}  # fmt: skip
        self.guard.findings(self.guard.book.findings(kinds), self.clock())
        self.table.set_quarantined(self.guard.quarantined)
        events, self.guard.events = self.guard.events, []
        for event in events:
            self.recent.append(event)
            log.warning(
                "quality: %s %s (%s): %s %.3g against its peers' %.3g; e.g. %s",
                event.worker, event.kind, event.model, event.check, event.figure,
                event.peers_figure, ", ".join(event.examples) or "-",
            )  # fmt: skip
