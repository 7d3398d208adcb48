"""A region's gateway run in the test's own process, over real simulated engines (child
processes) and a real HTTP port, so that a test can put a fault where no request could: an
exception nobody expected, at any point of a request's path. Its state (the router's
in-flight counts, admission, quota buckets, peers) is then read directly.

Two such gateways make an escalation: `a` has a fallback rule to `b`, whose snapshot trusts
`a`'s signing key.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from meridian_pb.fleet.v1.params import CostParams

from agents.config import (
    ApiKey,
    FallbackChain,
    ModelConfig,
    Peer,
    RegionConfig,
    RouteConfig,
    Tenant,
    WorkerSpec,
)
from agents.gateway.limits import DEFAULT_LIMITS, Limits
from agents.gateway.service import Gateway
from agents.http import build_app
from agents.router.router import Router
from agents.signing import Sender, Signer
from agents.workers.poller import LoadPoller
from agents.workers.table import WorkerTable
from meridian.procs import free_port

MODEL = "llama"
KEY = "sk-inproc-test-key-0123456789"
OPERATOR = "operator-token-0123456789"
TENANT = Tenant("acme", "standard", None, 1000.0, 60000.0)  # 1,000 tokens a second
OTHER_KEY = "sk-inproc-other-key-0123456789"
OTHER = Tenant("beta", "standard", None, 1000.0, 60000.0)  # a second tenant


@dataclass
class Local:
    """One in-process region: its gateway, its URL, and its config."""

    gateway: Gateway
    url: str
    config: RegionConfig

    def inflight(self) -> dict[str, int]:
        return {w: v.inflight for w, v in self.gateway.router.views.items()}

    def peers_inflight(self) -> dict[str, int]:
        return {r: v.inflight for r, v in self.gateway.escalations.peers.items()}

    def tokens_left(self) -> float:
        return self.gateway.quotas._tokens[TENANT.name].level

    def idle(self) -> bool:
        """Nothing held: no request in flight to a worker or a peer, none waiting, no
        tenant's place on a model (fair admission's)."""
        return (
            not any(self.inflight().values())
            and not any(self.peers_inflight().values())
            and not any(self.gateway.admission.waiting.values())
            and not self.gateway.admission.fair.held
        )


def region_config(name: str, engines: list[str], **changes: object) -> RegionConfig:
    workers = tuple(
        WorkerSpec(f"{name}-w{i}", MODEL, "d", "unified", url, None)
        for i, url in enumerate(engines)
    )
    config = RegionConfig(
        revision=1,
        digest="d",
        region=name,
        cloud="c",
        jurisdiction="us",
        models={MODEL: ModelConfig(MODEL, 4096, frozenset())},
        routes={MODEL: RouteConfig(MODEL, "cost", CostParams(), None, None, None, 64)},
        workers=workers,
        keys={
            hashlib.sha256(KEY.encode()).hexdigest(): ApiKey(TENANT, "sk-inpro", None),
            hashlib.sha256(OTHER_KEY.encode()).hexdigest(): ApiKey(OTHER, "sk-inpro", None),
        },
        tenants={TENANT.name: TENANT, OTHER.name: OTHER},
    )
    return replace(config, **changes)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def local_gateway(
    config: RegionConfig, port: int | None = None, limits: Limits = DEFAULT_LIMITS
) -> AsyncIterator[Local]:
    """The region's gateway on `port` (a free one by default), its engines taken as ready,
    with its load poller and its audit (every 0.2 s) running."""
    table = WorkerTable()
    gateway = Gateway(Router(table), operator_token=OPERATOR, limits=limits)
    table.replace(config.workers)
    gateway.configure(config)
    for worker in config.workers:
        table.set_engine_state(worker.id, "ready")
    runner = web.AppRunner(build_app(gateway, dict, OPERATOR), handler_cancellation=True)
    await runner.setup()
    port = port or free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(LoadPoller(table, 0.2, 2.0).run()),
             loop.create_task(gateway.audit_forever(0.2))]  # fmt: skip
    try:
        yield Local(gateway, f"http://127.0.0.1:{port}", config)
    finally:
        for task in tasks:
            task.cancel()
        await runner.cleanup()
        await gateway.close()


@contextlib.asynccontextmanager
async def escalating_pair(a_engines: list[str], b_engines: list[str]) -> AsyncIterator[
    tuple[Local, Local]
]:  # fmt: skip
    """`a` escalates to `b` on failure (every attempt of its own failed, or none serves)."""
    key = Ed25519PrivateKey.generate()
    b_port = free_port()
    b_config = region_config(
        "b", b_engines, senders={"a": Sender("a", "us", {"a-k": key.public_key()})}
    )
    peer = Peer("b", "us", f"http://127.0.0.1:{b_port}", frozenset({MODEL}))
    chain = FallbackChain("to-b", None, None, frozenset({"failure"}), (peer,))
    a_config = region_config("a", a_engines, fallback=(chain,), signer=Signer("a-k", key))
    async with local_gateway(a_config) as a, local_gateway(b_config, b_port) as b:
        yield a, b
