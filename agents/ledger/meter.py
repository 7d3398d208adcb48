"""Each engine's own token counters into the ledger: read with each heartbeat's telemetry,
journaled for each engine every `every_s` as a `meter` record of the prompt and generation
tokens it counted since the last, less the agent's own canaries' (an engine that restarted
counts from its start; one seen for the first time starts the count). A reading is put off
while one of the agent's own calls may straddle it (under way, or begun since the counters
were asked for), so that a canary's tokens leave the very interval the engine counted them
in. The control plane compares them with the records of the requests the engine served
over the same interval (controlplane/services/usage/reconcile.py)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

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
        self._begun: Counter[str] = Counter()  # engine: the agent's own calls begun
        self._busy: Counter[str] = Counter()  # engine: the agent's own calls under way

    @contextmanager
    def owning(self, engine: str) -> Iterator[Callable[[int, int], None]]:
        """One call of the agent's own on the engine (a quality canary): no tenant's. The
        tokens it is told it took are left out of the engine's count."""
        self._begun[engine] += 1
        self._busy[engine] += 1

        def spent(prompt: int, generation: int) -> None:
            counted = self._own.setdefault(engine, [0, 0])
            counted[0] += prompt
            counted[1] += generation

        try:
            yield spent
        finally:
            self._busy[engine] -= 1

    def mark(self) -> dict[str, tuple[int, int]]:
        """Taken before the engines' counters are asked for, and given back to `read`: per
        engine, the agent's own calls begun and under way then."""
        return {e: (n, self._busy[e]) for e, n in self._begun.items()}

    def read(self, counters: Mapping[str, Counters], mark: Mapping[str, tuple[int, int]]) -> None:
        now = self.wall()
        for engine, counted in counters.items():
            since = self._since.get(engine)
            if since is None:
                self._since[engine] = (now, counted)
                continue
            at, then = since
            if now - at < self.every_s:
                continue
            begun, busy = mark.get(engine, (0, 0))
            if busy or self._busy[engine] or begun != self._begun[engine]:
                continue  # an own call may straddle the counters: the next reading takes it
            delta = counted.minus(then)
            own = self._own.pop(engine, [0, 0])
            self.ledger.meter(self.region(), engine, at, now, round(delta.prompt_tokens) - own[0],
                              round(delta.generation_tokens) - own[1])  # fmt: skip
            self._since[engine] = (now, counted)
