"""Reconcile the engines the snapshot wants with the ones that run. Level-triggered: `want`
replaces the desired set and wakes the loop; the loop stops what is no longer wanted (or
changed), then starts what is missing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from agents.engines.base import Backend, EngineSpec
from agents.engines.children import reap_strays
from agents.engines.runner import EngineRunner, EngineState, StateListener, pid_path
from agents.settings import AgentSettings

log = logging.getLogger(__name__)


class Supervisor:
    def __init__(
        self,
        settings: AgentSettings,
        backends: Mapping[str, Backend],
        log_dir: Path,
        on_state: StateListener | None = None,
    ):
        self.settings = settings
        self.on_state = on_state
        self.backends = backends
        self.log_dir = log_dir
        self.runners: dict[str, EngineRunner] = {}
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
        """Until the last `want` has been acted on (engines started, not necessarily ready)."""
        await self._idle.wait()

    async def run(self) -> None:
        try:
            while True:
                await self._changed.wait()
                self._changed.clear()
                await self._reconcile(dict(self._desired))
                if not self._changed.is_set():
                    self._idle.set()
        finally:
            await self.stop_all()

    async def _reconcile(self, desired: dict[str, EngineSpec]) -> None:
        if not self._reaped:  # engines a previous agent left running and no one wants now
            keep = {pid_path(self.log_dir, i) for i in desired}
            stopped = await asyncio.to_thread(reap_strays, self.log_dir, keep)
            if stopped:
                log.info("stopped %d engine(s) left by a previous agent", stopped)
            self._reaped = True
        leaving = [r for i, r in self.runners.items() if i not in desired or desired[i] != r.spec]
        if leaving:
            log.info("stopping %d engine(s)", len(leaving))
            await asyncio.gather(*(r.stop() for r in leaving))
            for runner in leaving:
                del self.runners[runner.spec.id]
        for engine_id, spec in sorted(desired.items()):
            if engine_id not in self.runners:
                runner = EngineRunner(
                    spec, self.backends[spec.backend], self.settings, self.log_dir, self.on_state
                )
                if self.on_state is not None:
                    self.on_state(engine_id, runner.state)
                self.runners[engine_id] = runner
                runner.start()

    async def stop_all(self) -> None:
        runners, self.runners = list(self.runners.values()), {}
        await asyncio.gather(*(r.stop() for r in runners), return_exceptions=True)

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
                "last_exit": r.last_exit,
                "reason": r.reason,
                "running_requests": r.load.running,
                "waiting_requests": r.load.waiting,
            }
            for r in sorted(self.runners.values(), key=lambda r: r.spec.id)
        ]

    def ready(self) -> list[EngineRunner]:
        return [r for r in self.runners.values() if r.state is EngineState.READY]
