"""One engine's life: start, wait for readiness, probe, restart with backoff, drain and stop.

States: starting -> ready <-> unhealthy; a process that exits or stays unhealthy is killed
and started again after 1, 2, 4 ... seconds (capped); after `crash_loop_restarts` failures
in a row it is left down as `crash_loop` until the snapshot changes it. A stop drains first
(no new work is routed to a draining engine; it waits for running requests), then SIGTERM to
the engine's process group, then SIGKILL after the grace period.

The runner keeps readiness only: `/ready` at every probe and, now and then, `/health`. What
the engine runs (its load, its version, whether its scheduler still answers) is read from
the one observer of engines' load, the load poller, through `observe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import IO

import httpx

from agents.engines import contract, ports
from agents.engines.base import Backend, EngineSpec, Launch
from agents.engines.children import Adopted, PidFile, kill_group, kill_leader
from agents.errors import AgentError
from agents.settings import AgentSettings

log = logging.getLogger(__name__)
UNHEALTHY_AFTER = 2  # failed probes in a row before the engine is reported unhealthy
RESTART_AFTER = 5  # failed probes in a row before it is restarted


class EngineState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    UNHEALTHY = "unhealthy"
    DRAINING = "draining"
    STOPPED = "stopped"
    CRASH_LOOP = "crash_loop"


@dataclass
class Load:
    running: int = 0
    waiting: int = 0


StateListener = Callable[[str, EngineState], None]
Observe = Callable[[str], contract.Seen | None]  # the load poller's, by engine id


def unobserved(engine_id: str) -> contract.Seen | None:
    return None


class EngineRunner:
    def __init__(
        self,
        spec: EngineSpec,
        backend: Backend,
        settings: AgentSettings,
        log_dir: Path,
        on_state: StateListener | None = None,
        observe: Observe = unobserved,
    ):
        self.spec, self.backend, self.settings = spec, backend, settings
        self._on_state = on_state
        self._observe = observe
        self._state = EngineState.STARTING
        self.log_path = log_dir / f"{file_stem(spec.id)}.log"
        self.pidfile = PidFile(pid_path(log_dir, spec.id))
        self.failures = 0  # in a row
        self.restarts = 0
        self.last_exit: int | None = None
        self.reason = ""
        self.notes: tuple[str, ...] = ()  # what its launch says of itself (CPU, stand-ins)
        self.ready_after_s = 0.0  # its last start, launch to ready; 0: not known
        self._launched_at: float | None = None  # loop time of the launch being awaited
        self._generated_at = float("-inf")  # loop time of the last /health that generated
        self.process: asyncio.subprocess.Process | Adopted | None = None
        self._task: asyncio.Task[None] | None = None
        self._http = httpx.AsyncClient(timeout=settings.probe_timeout_s)

    @property
    def state(self) -> EngineState:
        return self._state

    @state.setter
    def state(self, state: EngineState) -> None:
        """Every change is told to the listener (the worker table) at once."""
        if state is not self._state:
            self._state = state
            if self._on_state is not None:
                self._on_state(self.spec.id, state)

    @property
    def load(self) -> Load:
        """What it runs, as the load poller last read it."""
        seen = self._observe(self.spec.id)
        if seen is None or seen.reading is None:
            return Load()
        return Load(seen.reading.running, seen.reading.waiting)

    @property
    def version(self) -> str:
        """The engine's own, from its answers."""
        seen = self._observe(self.spec.id)
        return seen.reading.version if seen is not None and seen.reading is not None else ""

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None and not self._exited() else None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._life(), name=self.spec.id)

    async def stop(self, evacuate: Callable[[str], Awaitable[None]] | None = None) -> None:
        """Drain, SIGTERM, SIGKILL; then it stays stopped. Requests still running at the
        drain deadline are handed to `evacuate` (the gateway carries them on elsewhere)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.process is not None and not self._exited():
            self.state = EngineState.DRAINING
            if not await self._drain() and evacuate is not None:
                log.info("engine %s: its drain deadline passed with requests running; they are "
                         "carried on elsewhere", self.spec.id)  # fmt: skip
                await evacuate(self.spec.id)
            await self._terminate()
        self.state = EngineState.STOPPED
        await self._http.aclose()

    async def _life(self) -> None:
        if not self.backend.launched:
            await self._probe_forever()
            return
        while True:
            ready_since: float | None = None
            try:
                if not await self._adopt():
                    await self._spawn()
                ready_since = await self._until_ready()
                if ready_since is not None:
                    await self._watch()
            except PortHeld as error:  # not ours to fix: said once, clearly, and tried again
                log.error("engine %s: %s", self.spec.id, error, extra={"engine_id": self.spec.id})
                self.reason = error.message
            except Exception as error:  # a loop boundary: report, back off, go on
                log.exception("engine %s failed", self.spec.id, extra={"engine_id": self.spec.id})
                self.reason = f"{type(error).__name__}: {error}"
            if self.process is not None and self._exited():
                self.last_exit = self.process.returncode
                self.reason = f"exited with {self.process.returncode}"
            await self._terminate()
            loop = asyncio.get_running_loop()
            if (
                ready_since is not None
                and loop.time() - ready_since >= self.settings.restart_backoff_max_s
            ):
                self.failures = 0  # it ran well for a while: this is a fresh failure
            self.failures += 1
            if self.failures >= self.settings.crash_loop_restarts:
                self.state = EngineState.CRASH_LOOP
                self.reason = f"{self.failures} failures in a row; last: {self.reason}"
                log.error("engine %s is crash-looping: %s", self.spec.id, self.reason)
                return
            self.state = EngineState.STARTING
            s = self.settings
            await asyncio.sleep(
                backoff_s(self.failures, s.restart_backoff_s, s.restart_backoff_max_s)
            )
            self.restarts += 1

    async def _adopt(self) -> bool:
        """Take over the engine a previous agent left running, if it runs these settings."""
        if self.process is not None:  # a restart: start afresh
            return False
        launch = await asyncio.to_thread(self._launch)
        adopted = await asyncio.to_thread(self.pidfile.adopt, launch)
        if adopted is None:
            return False
        self.notes = launch.notes
        self.process = adopted
        log.info("engine %s adopted, pid %s", self.spec.id, adopted.pid)
        return True

    async def _spawn(self) -> None:
        held = await asyncio.to_thread(ports.held_by_others, self.spec.host, self.spec.port)
        if held is not None:
            raise PortHeld(
                f"port {self.spec.port} is held by another process, {held.describe()}: "
                "the engine is not started there (stop that process, or move the engine)"
            )
        launch = await asyncio.to_thread(self._launch)
        self.notes = launch.notes
        output = await asyncio.to_thread(open_log, self.log_path)
        try:
            self.process = await asyncio.create_subprocess_exec(
                *launch.argv,
                env={**os.environ, **launch.env},
                stdout=output,
                stderr=output,
                start_new_session=True,  # its own process group: signals reach its children
            )
        finally:
            output.close()
        self._launched_at = asyncio.get_running_loop().time()
        await asyncio.to_thread(self.pidfile.write, self.process.pid, launch)
        self.state = EngineState.STARTING
        log.info("engine %s started, pid %s", self.spec.id, self.process.pid)

    def _launch(self) -> Launch:
        launch = self.backend.launch(self.spec)
        if self.settings.engine_nice:
            niced = ["nice", "-n", str(self.settings.engine_nice), *launch.argv]
            launch = Launch(niced, launch.env, launch.notes)
        return launch

    async def _until_ready(self) -> float | None:
        """The loop time it became healthy; None if it exited or timed out first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.engine_start_timeout_s
        while loop.time() < deadline:
            if self._exited():
                return None
            if await self._probe(starting=True) and await self._answered_by_ours():
                self.state = EngineState.READY
                self.reason = ""
                if self._launched_at is not None:  # an adopted engine's start is not known
                    self.ready_after_s = round(loop.time() - self._launched_at, 3)
                    self._launched_at = None
                return loop.time()
            await asyncio.sleep(min(0.2, self.settings.probe_interval_s))
        self.reason = f"not healthy within {self.settings.engine_start_timeout_s:.0f} s"
        return None

    async def _answered_by_ours(self) -> bool:
        """What answered the probe is this engine (its process group listens on its port),
        not another process on the same port."""
        assert self.process is not None
        group = self.process.pid  # the engine leads its own session and group
        if not ports.known():
            return True
        found = await asyncio.to_thread(ports.holders, self.spec.host, self.spec.port)
        if any(h.group == group for h in found):
            return True
        held = next(iter(found), None)
        if held is not None:
            raise PortHeld(
                f"port {self.spec.port} is answered by another process, {held.describe()}, "
                "not by this engine"
            )
        return False

    async def _watch(self) -> None:
        failed = 0
        while not self._exited():
            await asyncio.sleep(self.settings.probe_interval_s)
            if self._exited():
                break
            if await self._probe():
                failed = 0
                self.state = EngineState.READY
                continue
            failed += 1
            if failed >= UNHEALTHY_AFTER:
                self.state = EngineState.UNHEALTHY
                self.reason = f"{failed} health probes failed in a row"
            if failed >= RESTART_AFTER:
                return

    async def _probe_forever(self) -> None:
        """An external engine: only its health is ours to know."""
        failed = 0
        while True:
            if await self._probe():
                failed = 0
                self.state, self.reason = EngineState.READY, ""
            else:
                failed += 1
                if failed >= UNHEALTHY_AFTER or self.state is EngineState.STARTING:
                    self.state = EngineState.UNHEALTHY
                    self.reason = f"{self.spec.url} is not ready (/ready, /v1/loads, /health)"
            await asyncio.sleep(self.settings.probe_interval_s)

    def _exited(self) -> bool:
        if self.process is None:
            return False
        if isinstance(self.process, Adopted):
            self.process.alive()
        return self.process.returncode is not None

    async def _probe(self, starting: bool = False) -> bool:
        """Ready (`/ready`, cheap); its scheduler answering (`/v1/loads`, as the load poller
        sees it; not yet asked of an engine still starting); and now and then `/health`,
        which runs a generation (a second or more on SGLang 0.5.23)."""
        try:
            ready = await self._http.get(self.spec.url + contract.READY)
            if ready.status_code != 200:
                return False
            seen = self._observe(self.spec.id)
            if not starting and seen is not None and seen.silent:
                return False
            return await self._generates()
        except httpx.HTTPError:
            return False

    async def _generates(self) -> bool:
        """`/health` (a one-token generation) at most every `health_generate_s`."""
        loop = asyncio.get_running_loop()
        if loop.time() - self._generated_at < self.settings.health_generate_s:
            return True
        health = await self._http.get(
            self.spec.url + contract.HEALTH, timeout=max(30.0, self.settings.probe_timeout_s)
        )
        if health.status_code != 200:
            return False
        self._generated_at = loop.time()
        return True

    async def _drain(self) -> bool:
        """Until the engine runs nothing (True) or its drain deadline passes (False)."""
        loop = asyncio.get_running_loop()
        timeout = self.spec.drain_timeout_s
        deadline = loop.time() + (self.settings.drain_timeout_s if timeout is None else timeout)
        while not self._exited():
            if not await self._probe() or self.load.running + self.load.waiting == 0:
                return True
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.2)
        return True

    async def _terminate(self) -> None:
        process = self.process
        if process is None:
            return
        if not self._exited():
            # SIGTERM to the engine alone: SGLang's server then stops its scheduler and
            # detokenizer itself (signalled too, they die first and it reports a crash)
            kill_leader(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), self.settings.stop_grace_s)
            except TimeoutError:
                log.warning("engine %s ignored SIGTERM; killing it", self.spec.id)
                kill_group(process.pid, signal.SIGKILL)
                await process.wait()
            self.last_exit = process.returncode
        kill_group(process.pid, signal.SIGKILL)  # whatever of its group is left
        await asyncio.to_thread(self.pidfile.remove)


class PortHeld(AgentError):
    code = "port_held"


def backoff_s(failures: int, base_s: float, cap_s: float) -> float:
    """The pause before the next start after `failures` failures in a row: doubling, capped."""
    return float(min(cap_s, base_s * 2 ** (failures - 1)))


def file_stem(engine_id: str) -> str:
    return engine_id.replace("/", "__")


def pid_path(log_dir: Path, engine_id: str) -> Path:
    return log_dir / f"{file_stem(engine_id)}.pid"


def open_log(path: Path) -> IO[bytes]:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.open("ab")
