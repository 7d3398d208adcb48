"""The live worker table: every worker of the region, as its health checks and load polls see it.

Written by the supervisor (the state of this node's engines) and the load poller (every
worker's reachability and `/v1/loads`); read by the router. Touched on the event loop only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from agents.config import WorkerSpec
from agents.engines.contract import ServerInfo

# Engine states (the supervisor's) under which a local engine takes no new work.
NOT_SERVING = frozenset({"starting", "draining", "stopped", "crash_loop", "unhealthy"})
READY = "ready"


@dataclass
class EngineLoad:
    """What the engine says of itself at the last poll."""

    running: int = 0
    waiting: int = 0
    used_tokens: int = 0
    pending_tokens: int = 0  # uncached prompt tokens waiting for prefill, as it estimates
    max_total_tokens: int = 0
    step_s: float = 0.0  # seconds a token of each running answer takes, from the engine's
    # generation throughput (prefill steps between decode steps count); 0: unknown or idle
    at: float = 0.0  # monotonic time of the poll
    max_running: int = 0  # requests it runs at once at the most; 0: not known

    @property
    def kv_usage(self) -> float:
        return self.used_tokens / self.max_total_tokens if self.max_total_tokens else 0.0


@dataclass
class WorkerEntry:
    spec: WorkerSpec
    reachable: bool = False  # the poller got an answer lately
    failed_polls: int = 0
    engine_state: str | None = None  # the supervisor's, for engines of this node
    load: EngineLoad = field(default_factory=EngineLoad)
    polls: int = 0  # answered polls, so the router can tell fresh load from old
    info: ServerInfo | None = None  # what it says of itself once (`/server_info`)
    quarantined: bool = False  # the quality guard's: it answers wrong (agents/quality)
    # the LoRA adapters it holds (name to the path it loaded each from), as its `/v1/models`
    # last said or a load here since; cleared when its engine stops being ready
    adapters: dict[str, str] = field(default_factory=dict)

    def room(self) -> bool:
        """It may load one more adapter without unloading one (`--max-loaded-loras`)."""
        most = self.info.max_loaded_loras if self.info is not None else None
        return most is None or len(self.adapters) < most

    @property
    def serving(self) -> bool:
        """Reachable, not starting, draining or stopped by its supervisor, not quarantined."""
        return self.reachable and self.engine_state not in NOT_SERVING and not self.quarantined


class WorkerTable:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.entries: dict[str, WorkerEntry] = {}
        self._listeners: list[Callable[[], None]] = []

    def replace(self, specs: Iterable[WorkerSpec]) -> None:
        """A new snapshot's workers; an unchanged worker keeps what is known of it."""
        entries: dict[str, WorkerEntry] = {}
        for spec in specs:
            old = self.entries.get(spec.id)
            if old is not None and old.spec == spec:
                entries[spec.id] = old
            else:
                entries[spec.id] = WorkerEntry(spec)
        self.entries = entries
        self.changed()

    def get(self, worker_id: str) -> WorkerEntry | None:
        return self.entries.get(worker_id)

    def set_quarantined(self, workers: frozenset[str]) -> None:
        """The quality guard's quarantine: these workers are routed around (still polled)."""
        changed = False
        for worker_id, entry in self.entries.items():
            held = worker_id in workers
            if entry.quarantined != held:
                entry.quarantined, changed = held, True
        if changed:
            self.changed()

    def set_engine_state(self, worker_id: str, state: str) -> None:
        """The supervisor's state of a local engine. Its health check answering (ready) is
        as good a sign of reach as a poll, so a request sent the moment the engine is ready
        is served, not refused until the next poll lands."""
        entry = self.entries.get(worker_id)
        if entry is not None and entry.engine_state != state:
            entry.engine_state = state
            if state == READY:
                entry.reachable, entry.failed_polls = True, 0
            else:  # a restart starts it with none: its adapters are loaded again first
                entry.adapters = {}
            self.changed()

    def holds(self, worker_id: str, adapters: dict[str, str]) -> None:
        """What the worker says it holds (`/v1/models`), or what a load there just did."""
        entry = self.entries.get(worker_id)
        if entry is not None and entry.adapters != adapters:
            entry.adapters = adapters
            self.changed()

    def polled(self, worker_id: str, load: EngineLoad | None, fail_after: int) -> None:
        """A poll's outcome: its load, or None when the worker did not answer."""
        entry = self.entries.get(worker_id)
        if entry is None:
            return
        if load is None:
            entry.failed_polls += 1
            if entry.failed_polls >= fail_after:
                entry.reachable = False
        else:
            if entry.info is not None and not load.max_total_tokens:
                load.max_total_tokens = entry.info.max_total_tokens
            entry.load, entry.failed_polls, entry.reachable = load, 0, True
            entry.polls += 1
        self.changed()

    def described(self, worker_id: str, info: ServerInfo) -> None:
        entry = self.entries.get(worker_id)
        if entry is not None:
            entry.info = info
            entry.load.max_total_tokens = info.max_total_tokens

    def on_change(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def changed(self) -> None:
        for listener in self._listeners:
            listener()
