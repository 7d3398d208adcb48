"""Each engine's own token counters into the ledger: read with each heartbeat's telemetry,
journaled for each engine every `every_s` as a `meter` record of the prompt and generation
tokens it counted since the last, less the agent's own canaries' (an engine that restarted
counts from its start; one seen for the first time starts the count). The control plane
compares them with the records of the requests the engine served over the same interval
(controlplane/services/usage/reconcile.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from agents.engines.metrics import Counters
from agents.ledger.record import Ledger


class Meter:
    def __init__(
        self,
        ledger: Ledger,
        region: Callable[[], str],
        every_s: float = 60.0,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.ledger, self.region, self.every_s, self.wall = ledger, region, every_s, wall
        self._since: dict[str, tuple[float, Counters]] = {}  # engine: when, its counters then
        self._own: dict[str, list[int]] = {}  # engine: prompt, generation of the agent's own

    def own(self, engine: str, prompt: int, generation: int) -> None:
        """Tokens the agent itself had the engine make (the quality guard's canaries): no
        tenant's, left out of the engine's count."""
        counted = self._own.setdefault(engine, [0, 0])
        counted[0] += prompt
        counted[1] += generation

    def read(self, counters: Mapping[str, Counters]) -> None:
        now = self.wall()
        for engine, counted in counters.items():
            since = self._since.get(engine)
            if since is None:
                self._since[engine] = (now, counted)
                continue
            at, then = since
            if now - at < self.every_s:
                continue
            delta = counted.minus(then)
            own = self._own.pop(engine, [0, 0])
            self.ledger.meter(self.region(), engine, at, now, round(delta.prompt_tokens) - own[0],
                              round(delta.generation_tokens) - own[1])  # fmt: skip
            self._since[engine] = (now, counted)
