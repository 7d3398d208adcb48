"""The node agent: the control link, the engine supervisor and the agent's HTTP port, together.

On start it applies the snapshot on disk, if any, so a node whose control plane is down still
runs its engines; then it keeps the stream to the control plane and applies what comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator
from typing import Any

import uvicorn
from meridian_pb.fleet.v1 import fleet_pb2 as pb
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agents.control.link import ControlLink
from agents.control.plan import engine_specs, inventory
from agents.control.store import Store
from agents.engines import gpus
from agents.engines.backends import backends
from agents.engines.supervisor import Supervisor
from agents.errors import SnapshotInvalid
from agents.settings import AgentSettings
from agents.telemetry import TelemetryWindow

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn, minus re-raising SIGTERM after its shutdown: that would kill the agent before
    it stops its engines. The agent handles the signals itself."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stop)
        try:
            yield
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    def _stop(self) -> None:
        if self.should_exit:
            self.force_exit = True
        self.should_exit = True


class Agent:
    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self.store = Store(settings.data_dir)
        self.backends = backends()
        self.nvml = gpus.discover()
        self.supervisor = Supervisor(settings, self.backends, settings.data_dir / "engines")
        self.snapshot: pb.Snapshot | None = None
        self.window = TelemetryWindow()
        self.link = ControlLink(
            settings,
            self.store,
            current=lambda: self.snapshot,
            apply=self.apply,
            telemetry=self.telemetry,
            gpus=self.nvml,
        )

    @property
    def source(self) -> str:
        """Where the snapshot in force stands: `disk` until the control plane has answered."""
        if self.snapshot is None:
            return "none"
        return "control-plane" if self.link.state.reached else "disk"

    async def apply(self, snapshot: pb.Snapshot) -> None:
        """Check, persist, then act; a snapshot that fails the check changes nothing."""
        specs = engine_specs(
            snapshot,
            region=self.settings.region,
            node=self.link.state.node,
            nvml=self.nvml,
            backends=self.backends,
        )
        await asyncio.to_thread(self.store.save_snapshot, snapshot)
        self.snapshot = snapshot
        self.supervisor.want(specs)
        log.info("applied revision %s: %d engine(s) here", snapshot.revision, len(specs))

    async def _from_disk(self) -> None:
        snapshot = await asyncio.to_thread(self.store.load_snapshot)
        if snapshot is None:
            return
        try:
            await self.apply(snapshot)
        except SnapshotInvalid as error:
            log.error("the snapshot on disk cannot run here: %s", error.message)
            return
        log.info("started from the snapshot on disk, revision %s", snapshot.revision)

    async def serve(self) -> None:
        """Run until SIGINT or SIGTERM; then stop every engine it started."""
        await asyncio.to_thread(self.store.prepare)
        await self._from_disk()
        tasks = [
            asyncio.create_task(self.supervisor.run(), name="supervisor"),
            asyncio.create_task(self.link.run(), name="control-link"),
        ]
        config = uvicorn.Config(
            self.app(),
            host=self.settings.host,
            port=self.settings.port,
            log_level="warning",
            access_log=False,
        )
        log.info(
            "agent of region %s on http://%s:%s", self.settings.region, config.host, config.port
        )
        try:
            await _Server(config).serve()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.supervisor.stop_all()

    def app(self) -> Starlette:
        return Starlette(
            routes=[Route("/healthz", self._healthz), Route("/agent/status", self._status)]
        )

    async def _healthz(self, _request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def _status(self, _request: Request) -> JSONResponse:
        return JSONResponse(self.status())

    def status(self) -> dict[str, Any]:
        link = self.link.state
        gpu_list = inventory(self.snapshot, link.node, self.nvml)
        return {
            "region": self.settings.region,
            "node": link.node or None,
            "revision": self.snapshot.revision if self.snapshot else None,
            "digest": self.snapshot.digest if self.snapshot else None,
            "source": self.source,
            "control_plane": {
                "target": self.settings.control_plane,
                "connected": link.connected,
                "last_error": link.last_error or None,
            },
            "engines": self.supervisor.status(),
            "gpus": [
                {"index": g.index, "model": g.model, "memory_gb": g.memory_gb, "source": g.source}
                for g in gpu_list
            ],
        }

    def telemetry(self) -> pb.Telemetry:
        gpu_list = inventory(self.snapshot, self.link.state.node, self.nvml)
        return self.window.report(self.supervisor.runners.values(), gpu_list, self.nvml is not None)
