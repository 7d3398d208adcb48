"""The admin REST API application."""

from __future__ import annotations

from fastapi import FastAPI

from controlplane.api import (
    auth,
    batches,
    budgets,
    keys,
    openapi,
    operator,
    planner,
    problems,
    quotas,
    rollouts,
    status,
    usage,
)
from controlplane.api.deps import Services
from controlplane.api.kinds import kind_router
from controlplane.coord.base import Coordinator, LocalCoordinator, replica_info
from controlplane.db.engine import Database
from controlplane.metrics import ControlPlaneMetrics
from controlplane.services.auth import Authenticator
from controlplane.services.batches.store import store_for
from controlplane.services.oidc import OidcVerifier
from controlplane.services.registry import KINDS
from controlplane.services.resources import Resources
from controlplane.services.revisions import RevisionFeed
from controlplane.services.sealing.keyring import Keyring
from controlplane.services.sealing.sealer import Sealer, sealer_for
from controlplane.services.status import StatusCache, fleet_status
from controlplane.settings import Settings


def create_app(
    settings: Settings,
    db: Database,
    feed: RevisionFeed | None = None,
    coordinator: Coordinator | None = None,
    metrics: ControlPlaneMetrics | None = None,
    sealer: Sealer | None = None,
) -> FastAPI:
    """The REST API; `feed` and `coordinator` come from the replica it runs in, if any."""
    feed = feed or RevisionFeed()
    sealer = sealer or sealer_for(settings)
    app = FastAPI(
        title="Meridian control plane",
        version="1",
        description="Admin API: fleet, routing, tenants and access. Errors are RFC 9457 "
        "problem details with a stable `code`.",
    )
    app.state.services = Services(
        settings=settings,
        db=db,
        resources=Resources(db, feed, sealer),
        auth=Authenticator(
            db, settings.admin_token, OidcVerifier(settings) if settings.oidc_issuer else None
        ),
        feed=feed,
        coordinator=coordinator or LocalCoordinator(replica_info(settings)),
        store=store_for(settings.object_store, settings.data_dir),
        keyring=Keyring(db, sealer, feed),
    )
    app.state.metrics = metrics = metrics or ControlPlaneMetrics()
    app.middleware("http")(metrics.timed)
    problems.install(app)
    openapi.install(app)
    app.state.status = StatusCache(lambda: fleet_status(db, settings.heartbeat_timeout_s))
    app.include_router(operator.router)
    app.include_router(status.router)
    app.include_router(rollouts.router)
    app.include_router(planner.router)
    app.include_router(quotas.router)
    app.include_router(batches.router)
    app.include_router(usage.router)
    app.include_router(keys.router)
    app.include_router(auth.router)
    app.include_router(budgets.router)
    for kind in KINDS:
        app.include_router(kind_router(kind))
    return app
