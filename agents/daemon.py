"""The node agent, composed: the control link, the engine supervisor, the worker table and its
load poller, the router and the gateway on the agent's HTTP port, in one TaskGroup.

On start it applies the snapshot on disk, if any, so a node whose control plane is down still
runs its engines and serves; then it keeps the stream to the control plane and applies what
comes. Each long-running loop catches, logs and starts again at its boundary, so none stops
unnoticed while the gateway goes on serving.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from meridian_pb.fleet.v1 import fleet_pb2 as pb

from agents import report
from agents.adapters.files import AdapterFiles
from agents.adapters.keeper import AdapterKeeper
from agents.books import Books
from agents.config import compile_config
from agents.control.link import ControlLink, QuotaHooks
from agents.control.plan import engine_specs
from agents.control.preemption import Notice, PreemptionWatch
from agents.control.store import Store
from agents.engines import gpus
from agents.engines.backends import backends, tokenizer
from agents.engines.runner import EngineState
from agents.engines.supervisor import Supervisor
from agents.errors import SnapshotInvalid
from agents.gateway.batches import BatchProxy
from agents.gateway.limits import Limits
from agents.gateway.service import Gateway
from agents.http import Runner, build_app
from agents.ledger.journal import Journal
from agents.ledger.meter import Meter
from agents.ledger.record import Ledger
from agents.quality.prober import Prober
from agents.router.router import Router
from agents.settings import AgentSettings
from agents.telemetry import TelemetryWindow
from agents.tracing import Tracing
from agents.workers.kv_events import KvEventSubscriber
from agents.workers.poller import LoadPoller
from agents.workers.table import WorkerTable

log = logging.getLogger(__name__)
LOOP_RESTART_S = 1.0


class Agent:
    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self.store = Store(settings.data_dir)
        self.nvml = gpus.discover()
        self.backends = backends(cpu=self.nvml is None, sglang_python=settings.sglang_python)
        self.table = WorkerTable()
        self.books = Books()  # every count the agent keeps: its parts write, its reports read
        self.router = Router(self.table, books=self.books)
        # /agent/* always needs a token: a tenant must not read which worker served whom
        token = settings.operator_token
        self.operator_token = (
            token.get_secret_value() if token is not None else self.store.operator_token()
        )
        endpoint = settings.trace_endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        self.tracing = (
            Tracing(endpoint, settings.trace_sample, settings.region, settings.node)
            if endpoint
            else None
        )
        self.gateway = Gateway(
            self.router,
            operator_token=self.operator_token,
            connect_timeout_s=settings.upstream_connect_timeout_s,
            tracing=self.tracing,
            limits=Limits(
                settings.max_body_bytes, settings.body_timeout_s, settings.client_stall_s
            ),
            quality_guard=settings.quality_guard,
        )
        self.batches = BatchProxy(settings.control_plane_url, lambda: self.gateway.config)
        self.poller = LoadPoller(
            self.table, settings.load_poll_s, settings.probe_timeout_s,
            local=lambda: self.supervisor.engines(),
        )  # fmt: skip
        self.supervisor = Supervisor(
            settings, self.backends, settings.data_dir / "engines", self._engine_state,
            evacuate=self.gateway.evacuate, observe=self.poller.observed,
        )  # fmt: skip
        self.prober = Prober(self.router, self.gateway.quality, save=self.store.save_canaries,
                             every_s=settings.canary_every_s)  # fmt: skip
        self.kv_events = KvEventSubscriber(self.router, self.table, tokenizer)
        self.adapters = AdapterKeeper(self.table, AdapterFiles(settings.data_dir / "adapters"),
                                      local=lambda: self.supervisor.runners)  # fmt: skip
        self.gateway.calls.adapters = self.adapters
        self.router.cold_load_s = self.adapters.cold_load_s
        self.preemption = PreemptionWatch(settings.preemption_notices,
                                          settings.preemption_poll_s, self._preempted)  # fmt: skip
        self.snapshot: pb.Snapshot | None = None
        self.applied_at: float | None = None  # wall clock
        self.window = TelemetryWindow()
        self.meter: Meter | None = None  # the engines' own counters into the ledger
        self.link = ControlLink(
            settings,
            self.store,
            current=lambda: self.snapshot,
            apply=self.apply,
            telemetry=functools.partial(report.telemetry, self),
            gpus=self.nvml if self.nvml is not None else gpus.simulated(settings.simulated_gpus),
            quotas=QuotaHooks(self.gateway.quotas.take_leases, self.gateway.quotas.report),
        )

    @property
    def source(self) -> str:
        """Where the snapshot in force stands: `disk` until the control plane has answered."""
        if self.snapshot is None:
            return "none"
        return "control-plane" if self.link.state.reached else "disk"

    def _engine_state(self, engine_id: str, state: EngineState) -> None:
        self.table.set_engine_state(engine_id, str(state))
        self.adapters.engine_state(engine_id, str(state))
        self.link.beat_soon()  # the control plane (and its status page) hears of it at once

    def _preempted(self, notice: Notice) -> None:
        """The machine is being taken back: every engine here drains, now and from now on."""
        self.supervisor.want([])
        self.link.beat_soon()  # the control plane takes the node out of placement

    async def apply(self, snapshot: pb.Snapshot) -> None:
        """Check and compile, persist, then act; a snapshot that fails changes nothing."""
        config = compile_config(snapshot)
        specs = engine_specs(
            snapshot,
            region=self.settings.region,
            node=self.link.state.node,
            nvml=self.nvml,
            backends=self.backends,
        )
        if self.preemption.notice is not None:
            specs = []  # a machine being taken back starts nothing
        await asyncio.to_thread(self.store.save_snapshot, snapshot)
        self.snapshot, self.applied_at = snapshot, time.time()
        self.table.replace(config.workers)
        for runner in self.supervisor.all():
            self.table.set_engine_state(runner.spec.id, str(runner.state))
        self.gateway.configure(config, {p.region: p.health for p in snapshot.peer_load})
        self.adapters.configure(config.adapters)
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
        budgets = self.gateway.quotas.budgets  # what they spent, kept across a restart
        await asyncio.to_thread(budgets.open, self.settings.data_dir / "budgets.json")
        journal: Journal | None = None
        if self.settings.usage_ledger:
            journal = await asyncio.to_thread(Journal, self.settings.data_dir / "ledger")
            journal.start()
            ledger = self.gateway.accounts.ledger = Ledger(journal, lambda: self.link.state.node)
            region = self.settings.region
            self.meter = Meter(ledger, lambda: region, self.settings.usage_meter_s)
            self.prober.meter = self.meter
            self.link.journal = journal
        self.prober.canaries.update(await asyncio.to_thread(self.store.load_canaries))
        await self._from_disk()
        app = build_app(
            self.gateway,
            functools.partial(report.status, self),
            self.operator_token,
            functools.partial(report.metric_families, self),
            self.batches,
        )
        runner = Runner(app, self.settings.header_timeout_s)
        await runner.setup()
        site = web.TCPSite(runner, self.settings.host, self.settings.port, backlog=4096)
        await site.start()
        log.info(
            "agent of region %s on http://%s:%s",
            self.settings.region,
            self.settings.host,
            self.settings.port,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            async with asyncio.TaskGroup() as group:
                supervising = group.create_task(_forever("supervisor", self.supervisor.run))
                loops = [
                    group.create_task(_forever("control-link", self.link.run)),
                    group.create_task(_forever("load-poller", self.poller.run)),
                    group.create_task(_forever("kv-events", self.kv_events.run)),
                    group.create_task(_forever("adapters", self.adapters.run)),
                    group.create_task(_forever("audit", self.gateway.audit_forever)),
                ]
                if self.settings.quality_guard:
                    loops.append(group.create_task(_forever("canaries", self.prober.run)))
                if self.settings.preemption_notices != "off":
                    loops.append(group.create_task(_forever("preemption", self.preemption.run)))
                await stop.wait()
                log.info("stopping: engines drain first")
                supervising.cancel()  # it stops its engines, drained, as the poller watches
                await asyncio.wait([supervising])
                for task in loops:
                    task.cancel()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            await self.supervisor.stop_all()
            await runner.cleanup()
            await self.gateway.close()
            await self.batches.close()
            self.gateway.accounts.ledger = None
            if journal is not None:
                await asyncio.to_thread(journal.close)  # every record on disk
            if self.tracing is not None:
                await asyncio.to_thread(self.tracing.shutdown)  # what is batched goes out


async def _forever(name: str, run: Callable[[], Awaitable[None]]) -> None:
    """A loop boundary: a loop that fails is logged and started again, never lost."""
    while True:
        try:
            await run()
            log.error("%s returned; starting it again", name)
        except Exception:
            log.exception("%s failed; starting it again", name)
        await asyncio.sleep(LOOP_RESTART_S)
