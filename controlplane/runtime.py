"""One control-plane replica: REST API, gRPC Fleet service, push hub and coordination."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator
from datetime import timedelta

import grpc
import uvicorn
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Tracer

from controlplane.api.app import create_app
from controlplane.coord.base import Coordinator, LocalCoordinator, replica_info
from controlplane.coord.etcd import EtcdCoordinator
from controlplane.coord.singletons import Singletons
from controlplane.db.engine import Database
from controlplane.metrics import ControlPlaneMetrics
from controlplane.push.hub import SnapshotHub
from controlplane.push.leases import LeaseFeed
from controlplane.push.server import start_grpc
from controlplane.push.service import FleetService
from controlplane.services.batches.runner import BatchRunner
from controlplane.services.batches.store import store_for
from controlplane.services.placements import seed_slots
from controlplane.services.planner.loop import Planner, PlannerConfig
from controlplane.services.planner.pools import PoolKeeper, providers_for
from controlplane.services.preemptions import Preemptions
from controlplane.services.quotas.demand import DemandBook
from controlplane.services.quotas.leaser import Leaser, utc_now
from controlplane.services.quotas.plan import Timing
from controlplane.services.reports import NodeReports
from controlplane.services.residency import Residency
from controlplane.services.revisions import RevisionFeed
from controlplane.services.rollouts.driver import RolloutDriver
from controlplane.services.sealing.keyring import Keyring
from controlplane.services.sealing.sealer import sealer_for
from controlplane.services.usage.reconcile import Reconciler
from controlplane.services.usage.store import UsageStore
from controlplane.settings import Settings
from controlplane.tracing import make_tracer

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn, whose SIGTERM and SIGINT stop the serving and return: uvicorn's own handling
    raises the signal again once it has stopped, and a SIGTERM raised so kills the process
    before what it runs in is closed (an embedded PostgreSQL would be left running)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        try:
            yield
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)


def make_coordinator(settings: Settings) -> Coordinator:
    me = replica_info(settings)
    if settings.etcd_hosts:
        return EtcdCoordinator(me, settings.etcd_hosts, settings.etcd_prefix, settings.lease_ttl_s)
    return LocalCoordinator(me)


class Replica:
    def __init__(self, settings: Settings, db: Database) -> None:
        self.settings = settings
        self.db = db
        self.feed = RevisionFeed()
        self.coordinator = make_coordinator(settings)
        traced = make_tracer(settings, self.coordinator.me.id)
        self.tracer: Tracer | None = traced[0] if traced else None
        self._provider: TracerProvider | None = traced[1] if traced else None
        self.metrics = ControlPlaneMetrics(self.tracer)
        self.sealer = sealer_for(settings)
        self.keyring = Keyring(db, self.sealer, self.feed)
        self.hub = SnapshotHub(db, tracer=self.tracer, metrics=self.metrics, sealer=self.sealer)
        self.reports = NodeReports(db)
        self.leases = LeaseFeed(db, ttl_s=settings.quota_lease_ttl_s)
        self.demand = DemandBook(db, self.coordinator.me.id)
        self.service = FleetService(
            db,
            self.hub,
            self.reports,
            self.coordinator,
            self.feed,
            heartbeat_timeout_s=settings.heartbeat_timeout_s,
            metrics=self.metrics,
            leases=self.leases,
            demand=self.demand,
            usage=UsageStore(db),
        )
        self.singletons = Singletons(
            self.coordinator,
            db,
            down_after=timedelta(seconds=settings.node_down_after_s),
            rollouts=RolloutDriver(db, self.feed, observe=self.metrics.rollout),
            leaser=(
                Leaser(
                    db,
                    Timing(settings.quota_lease_ttl_s, settings.node_down_after_s * 6),
                    observe=self.metrics.budget,
                )
                if settings.quota_leases
                else None
            ),
            preemptions=Preemptions(db, self.feed),
            planner=Planner(
                db,
                PlannerConfig.of(settings),
                self.feed,
                observe=self.metrics.planner,
                pools=PoolKeeper(
                    providers_for(settings),
                    cooldown_s=settings.planner_cooldown_s,
                    short_after_s=settings.planner_spot_short_s,
                ),
            ),
            keyring=self.keyring,
            batches=BatchRunner(
                db,
                self.keyring,
                store_for(settings.object_store, settings.data_dir),
                sent=self.metrics.batch_line,
                backlog=self.metrics.backlog,
            ),
            reconciler=Reconciler(db, settings.usage_reconcile_s, observe=self.metrics.drift),
            residency=Residency(
                db, settings.adapter_residency_s, settings.adapter_cold_rps, self.feed
            ),
        )
        self.feed.subscribe(self.coordinator.publish_revision)
        self.coordinator.on_revision(self.hub.announce)
        self._grpc: grpc.aio.Server | None = None

    async def serve(self) -> None:
        """Run until cancelled or until the REST server is told to stop (SIGINT, SIGTERM)."""
        settings = self.settings
        await self.coordinator.start()
        try:
            await seed_slots(self.db)
            await self.keyring.ensure()
            await self.hub.start()
            self.reports.start()
            self.leases.start()
            self.demand.start(utc_now)
            self._grpc = await start_grpc(self.service, settings)
            self.singletons.start()
            app = create_app(
                settings, self.db, self.feed, self.coordinator, self.metrics, self.sealer
            )
            config = uvicorn.Config(
                app,
                host=settings.host,
                port=settings.port,
                log_level=settings.log_level.lower(),
                access_log=False,
            )
            log.info(
                "replica %s: admin API on http://%s:%s, agents on %s:%s (%s)",
                self.coordinator.me.id,
                settings.host,
                settings.port,
                settings.host,
                settings.grpc_port,
                "TLS" if settings.tls_cert_file else "plaintext",
            )
            await _Server(config).serve()
        finally:
            await self.stop()

    async def stop(self) -> None:
        await self.singletons.stop()
        if self._grpc is not None:
            await self._grpc.stop(grace=1.0)
        await self.reports.stop()
        await self.demand.stop()
        await self.leases.stop()
        await self.hub.stop()
        await self.coordinator.stop()
        if self._provider is not None:
            await asyncio.to_thread(self._provider.shutdown)  # what is batched goes out
