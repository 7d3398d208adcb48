"""Reconcile the engines the snapshot wants with the ones that run. Level-triggered: `want`
replaces the desired set and wakes the loop, as does an engine that stops draining or turns
ready.

An engine the snapshot removes or replaces is retired: it takes no new request at once (its
worker is out of the table, or marked draining), finishes the ones it runs up to its drain
deadline, has what is still running carried on elsewhere by the gateway (`evacuate`), and only
then stops. Retiring never holds up the loop. A new engine starts at once when it shares no
id, port or GPU with a retiring one (surge), else once that one has stopped. Engines whose
spec changed in place (engine arguments, say) roll one at a time per deployment: the next is
retired only when the last one's replacement is ready, those not serving first.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from agents.engines.base import Backend, EngineSpec
from agents.engines.children import reap_strays
from agents.engines.runner import (
    EngineRunner,
    EngineState,
    Observe,
    StateListener,
    pid_path,
    unobserved,
)
from agents.settings import AgentSettings

log = logging.getLogger(__name__)
RETRY_S = 1.0  # after a reconcile, or an engine's start, that failed
Evacuate = Callable[[str], Awaitable[None]]


class Supervisor:
    def __init__(
        self,
        settings: AgentSettings,
        backends: Mapping[str, Backend],
        log_dir: Path,
        on_state: StateListener | None = None,
        evacuate: Evacuate | None = None,
        observe: Observe = unobserved,
    ):
        """`observe`: the load poller's reading of an engine (what it runs, whether its
        scheduler answers), which drains and health checks read."""
        self.settings = settings
        self.observe = observe
        self.on_state = on_state
        self.evacuate = evacuate
        self.backends = backends
        self.log_dir = log_dir
        self.runners: dict[str, EngineRunner] = {}  # the wanted engines
        self.retiring: dict[str, EngineRunner] = {}  # draining, then stopped
        self._stops: set[asyncio.Task[None]] = set()
        self._desired: dict[str, EngineSpec] = {}
        self._changed = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._reaped = False

    def want(self, specs: Sequence[EngineSpec]) -> None:
        self._desired = {s.id: s for s in specs}
        self._idle.clear()
        self._changed.set()

    async def settled(self) -> None:
        """Until the last `want` has been acted on: every wanted engine started (not
        necessarily ready), every other one stopped."""
        await self._idle.wait()

    def all(self) -> list[EngineRunner]:
        """The wanted engines and the retiring ones."""
        return [*self.runners.values(), *self.retiring.values()]

    def engines(self) -> list[tuple[str, str]]:
        """(id, URL) of every engine here, the retiring ones too: what the poller watches."""
        return [(r.spec.id, r.spec.url) for r in self.all()]

    async def run(self) -> None:
        """Reconciles on every change until cancelled (the agent stops), then stops its
        engines. A pass that fails is logged and tried again: the engines running keep
        running, whatever went wrong with another."""
        try:
            while True:
                await self._changed.wait()
                self._changed.clear()
                try:
                    settled = await self._reconcile(dict(self._desired))
                except Exception:
                    log.exception("reconciling the engines failed; tried again in %g s", RETRY_S)
                    settled = False
                    self._retry_later()
                if settled:
                    self._idle.set()
        finally:
            await self.stop_all()

    def _retry_later(self) -> None:
        loop = asyncio.get_running_loop()
        loop.call_later(RETRY_S, self._changed.set)

    async def _reconcile(self, desired: dict[str, EngineSpec]) -> bool:
        """One pass; whether nothing is left to do."""
        if not self._reaped:  # engines a previous agent left running and no one wants now
            keep = {pid_path(self.log_dir, i) for i in desired}
            stopped = await asyncio.to_thread(reap_strays, self.log_dir, keep)
            if stopped:
                log.info("stopped %d engine(s) left by a previous agent", stopped)
            self._reaped = True
        for engine_id, runner in list(self.runners.items()):
            spec = desired.get(engine_id)
            if spec is None:
                self._retire(runner, "the snapshot removes it")
            elif spec == runner.spec:  # what needs no restart (its drain deadline) changes here
                runner.spec = spec
        for runner in self._next_to_roll(desired):
            self._retire(runner, "its spec changed")
        failed = False
        for engine_id, spec in sorted(desired.items()):
            if engine_id not in self.runners and not self._blocked(spec):
                try:
                    self._start(spec)
                except Exception:  # this engine's: the others start all the same
                    log.exception("engine %s could not be started; tried again in %g s",
                                  engine_id, RETRY_S)  # fmt: skip
                    failed = True
        if failed:
            self._retry_later()
        return not self.retiring and all(
            i in self.runners and self.runners[i].spec == s for i, s in desired.items()
        )

    def _next_to_roll(self, desired: dict[str, EngineSpec]) -> list[EngineRunner]:
        """Per deployment, one engine whose spec changed, when none of its deployment is
        retiring, waiting to start or starting: one that is not serving, else any."""
        stale: dict[str, list[EngineRunner]] = {}
        for engine_id, runner in self.runners.items():
            spec = desired.get(engine_id)
            if spec is not None and spec != runner.spec:
                stale.setdefault(runner.spec.deployment, []).append(runner)
        chosen = []
        for deployment, runners in sorted(stale.items()):
            busy = (
                any(r.spec.deployment == deployment for r in self.retiring.values())
                or any(s.deployment == deployment and i not in self.runners
                       for i, s in desired.items())
                or any(r.spec.deployment == deployment and r.state is EngineState.STARTING
                       for r in self.runners.values())
            )  # fmt: skip
            if not busy:
                runners.sort(key=lambda r: (r.state is EngineState.READY, r.spec.id))
                chosen.append(runners[0])
        return chosen

    def _blocked(self, spec: EngineSpec) -> bool:
        """It would share an id, a port or a GPU with an engine still retiring."""
        for old in self.retiring.values():
            if old.spec.id == spec.id or set(old.spec.gpu_indexes) & set(spec.gpu_indexes):
                return True
            if spec.backend != "external" and (old.spec.host, old.spec.port) == (
                spec.host, spec.port
            ):  # fmt: skip
                return True
        return False

    def _start(self, spec: EngineSpec) -> None:
        runner = EngineRunner(
            spec, self.backends[spec.backend], self.settings, self.log_dir, self._state,
            self.observe,
        )  # fmt: skip
        self._state(spec.id, runner.state)
        self.runners[spec.id] = runner
        runner.start()

    def _state(self, engine_id: str, state: EngineState) -> None:
        if self.on_state is not None:
            self.on_state(engine_id, state)
        if state is EngineState.READY:  # the next engine of a rolling change may go
            self._changed.set()

    def _retire(self, runner: EngineRunner, why: str) -> None:
        engine_id = runner.spec.id
        log.info("engine %s: draining, then stopping (%s)", engine_id, why)
        del self.runners[engine_id]
        self.retiring[engine_id] = runner
        task = asyncio.get_running_loop().create_task(self._stop(runner))
        self._stops.add(task)
        task.add_done_callback(self._stops.discard)

    async def _stop(self, runner: EngineRunner) -> None:
        try:
            await runner.stop(self.evacuate)
        finally:
            self.retiring.pop(runner.spec.id, None)
            self._changed.set()

    async def stop_all(self) -> None:
        """The wanted engines stopped (drained first), and the retiring ones awaited."""
        runners, self.runners = list(self.runners.values()), {}
        await asyncio.gather(
            *(r.stop(self.evacuate) for r in runners), *self._stops, return_exceptions=True
        )

    def status(self) -> list[dict[str, object]]:
        return [
            {
                "id": r.spec.id,
                "deployment": r.spec.deployment,
                "model": r.spec.model,
                "backend": r.spec.backend,
                "role": r.spec.role,
                "url": r.spec.url,
                "gpus": list(r.spec.gpu_indexes),
                "state": str(r.state),
                "pid": r.pid,
                "restarts": r.restarts,
                "ready_after_s": r.ready_after_s,
                "last_exit": r.last_exit,
                "reason": r.reason,
                "version": r.version,
                "notes": list(r.notes),
                "running_requests": r.load.running,
                "waiting_requests": r.load.waiting,
            }
            for r in sorted(self.all(), key=lambda r: r.spec.id)
        ]

    def ready(self) -> list[EngineRunner]:
        return [r for r in self.runners.values() if r.state is EngineState.READY]
