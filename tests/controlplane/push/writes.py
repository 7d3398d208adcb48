"""Random writes of every kind a snapshot is compiled from, through the admin API.

Some are refused (a delete of something still referred to, a node that does not fit): a
refused write changes nothing, which is as much a case for the compile as one that lands.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select

from controlplane.db.fleet_rows import DeploymentRow
from controlplane.services.planner.loop import Change, write_plans
from tests.kits.controlplane import Api

REGIONS = ["us-east", "us-west", "eu-west"]
MODELS = ["llama-3.1-8b-instruct", "qwen2.5-32b-instruct"]
TENANTS = ["acme", "eurobank"]


class Writer:
    def __init__(self, api: Api, rng: random.Random) -> None:
        self.api, self.rng = api, rng
        self.made: dict[str, list[str]] = {}  # plural -> names this writer created
        self.serial = 0

    async def one(self) -> tuple[str, bool]:
        """A random write; its kind and whether it landed."""
        kinds: list[tuple[str, Callable[[], Awaitable[int]]]] = [
            ("tenants", self.tenant),
            ("api-keys", self.api_key),
            ("nodes", self.node),
            ("models", self.model),
            ("deployments", self.deployment),
            ("regions", self.region),
            ("routing-policies", self.routing_policy),
            ("fallback-rules", self.fallback_rule),
            ("tiered-routes", self.tiered_route),
            ("clouds", self.cloud),
            ("rollout-policies", self.rollout_policy),
            ("engine-plans", self.engine_plan),
        ]
        kind, write = self.rng.choice(kinds)
        status = await write()
        return kind, status < 300

    # --- one write per kind ----------------------------------------------------------------

    async def tenant(self) -> int:
        names = TENANTS + self.made.get("tenants", [])
        spec: dict[str, Any] = {
            "requests_per_minute": self.rng.choice([None, 60, 1200, 6000]),
            "tokens_per_minute": self.rng.choice([None, 100_000]),
            "allowed_jurisdictions": self.rng.choice([None, ["us"], ["eu"], ["us", "eu"]]),
            "tiering": self.rng.random() < 0.5,
        }
        return await self._create_patch_delete("tenants", names, spec, spec)

    async def api_key(self) -> int:
        keys = self.made.get("api-keys", [])
        if keys and self.rng.random() < 0.4:
            return await self._patch("api-keys", self.rng.choice(keys), {"revoked": True})
        tenant = self.rng.choice(TENANTS + self.made.get("tenants", []))
        return await self._create("api-keys", {"tenant": tenant})

    async def node(self) -> int:
        names = ["us-east-1", "us-west-1", "eu-west-1", *self.made.get("nodes", [])]
        self.serial += 1
        gpus = [
            {"index": i, "model": "H100-SXM-80GB", "memory_gb": self.rng.choice([24, 80])}
            for i in range(self.rng.randint(0, 4))
        ]
        create = {
            "region": self.rng.choice(REGIONS),
            "hostname": f"10.0.0.{self.serial % 250 + 1}",
            "gpus": gpus,
        }
        patch = self.rng.choice(
            [{"state": s} for s in ("active", "draining", "disabled")] + [{"gpus": gpus}]
        )
        return await self._create_patch_delete("nodes", names, create, patch)

    async def model(self) -> int:
        patch: dict[str, Any] = self.rng.choice(
            [
                {"context_length": self.rng.choice([8192, 32768, 131072])},
                {"min_gpu_memory_gb": self.rng.choice([0, 24, 80])},
                {"capabilities": self.rng.choice([["chat"], ["chat", "completion", "tools"]])},
            ]
        )
        return await self._patch("models", self.rng.choice(MODELS), patch)

    async def deployment(self) -> int:
        names = [
            "llama-us-east",
            "llama-us-west",
            "llama-eu-west",
            *self.made.get("deployments", []),
        ]
        region = self.rng.choice(REGIONS)
        create: dict[str, Any]
        if self.rng.random() < 0.3:
            urls = [f"http://10.1.0.{i}:8000" for i in range(self.rng.randint(1, 3))]
            create = {
                "model": self.rng.choice(MODELS),
                "region": region,
                "backend": "external",
                "external_urls": urls,
            }
        else:
            create = {
                "model": self.rng.choice(MODELS),
                "region": region,
                "backend": "sim",
                "replicas": self.rng.randint(1, 3),
            }
        patch: dict[str, Any] = {"replicas": self.rng.randint(0, 3)}
        if self.rng.random() < 0.4:  # bounds for the planner (engine_plan writes its counts)
            patch = {"replicas": 1, "autoscale": {"min_replicas": 1, "max_replicas": 3}}
        return await self._create_patch_delete("deployments", names, create, patch)

    async def engine_plan(self) -> int:
        """What the capacity planner writes: engines for a deployment (counted where it has
        `autoscale`, within its bounds; left aside otherwise)."""
        names = ["llama-us-east", "llama-us-west", "llama-eu-west",
                 *self.made.get("deployments", [])]  # fmt: skip
        async with self.api.db.sessions() as session, session.begin():
            known = set(await session.scalars(select(DeploymentRow.name)))
            name = self.rng.choice(names)
            if name not in known:
                return 404
            change = Change(name, 0, self.rng.randint(0, 4), "a random plan", {})
            await write_plans(session, [change], datetime.now(UTC))
        return 200

    async def region(self) -> int:
        patch: dict[str, Any] = self.rng.choice(
            [
                {"state": self.rng.choice(["active", "active", "draining", "disabled"])},
                {"gateway_url": self.rng.choice([None, "http://127.0.0.1:9999"])},
            ]
        )
        return await self._patch("regions", self.rng.choice(REGIONS), patch)

    async def routing_policy(self) -> int:
        names = ["llama-default", "llama-eu-west", "qwen-default"]
        names += self.made.get("routing-policies", [])
        spec = {
            "model": self.rng.choice(MODELS),
            "region": self.rng.choice([None, *REGIONS]),
            "policy": self.rng.choice(["cost", "cache_aware"]),
            "params": self.rng.choice([{}, {"kv_events": True}]),
            "slo_ttft_ms": self.rng.choice([None, 500, 1500]),
        }
        patch = {"slo_ttft_ms": self.rng.choice([None, 300, 900])}
        return await self._create_patch_delete("routing-policies", names, spec, patch)

    async def fallback_rule(self) -> int:
        names = ["us-east-out", "us-west-out", "eu-west-out", *self.made.get("fallback-rules", [])]
        region = self.rng.choice(REGIONS)
        peers = self.rng.sample([r for r in REGIONS if r != region], self.rng.randint(1, 2))
        spec = {
            "region": region,
            "peers": peers,
            "model": self.rng.choice([None, *MODELS]),
        }
        patch = {"thresholds": {"ttft_ms": self.rng.choice([400, 800, 1600])}}
        return await self._create_patch_delete("fallback-rules", names, spec, patch)

    async def tiered_route(self) -> int:
        names = ["chat-auto", *self.made.get("tiered-routes", [])]
        spec = {"tiers": self.rng.sample(MODELS, 2), "capacity_moves": self.rng.random() < 0.5}
        return await self._create_patch_delete("tiered-routes", names, spec, spec)

    async def cloud(self) -> int:
        return await self._create("clouds", {"provider": "onprem"})

    async def rollout_policy(self) -> int:
        strategy = self.rng.choice(["immediate", "waves"])
        return await self._patch("rollout-policies", "default", {"strategy": strategy})

    # --- helpers ----------------------------------------------------------------------------

    async def _create_patch_delete(
        self, plural: str, names: list[str], create: dict[str, Any], patch: dict[str, Any]
    ) -> int:
        roll = self.rng.random()
        if roll < 0.4:
            return await self._create(plural, create)
        if roll < 0.85:
            return await self._patch(plural, self.rng.choice(names), patch)
        return await self._delete(plural, self.rng.choice(names))

    async def _create(self, plural: str, spec: dict[str, Any]) -> int:
        self.serial += 1
        name = f"{plural[:3]}-{self.serial}"
        response = await self.api.client.post(f"/v1/{plural}", json={"name": name, **spec})
        if response.status_code < 300:
            self.made.setdefault(plural, []).append(name)
        return response.status_code

    async def _patch(self, plural: str, name: str, patch: dict[str, Any]) -> int:
        response = await self.api.client.patch(
            f"/v1/{plural}/{name}", json=patch, headers={"If-Match": "*"}
        )
        return response.status_code

    async def _delete(self, plural: str, name: str) -> int:
        response = await self.api.client.delete(f"/v1/{plural}/{name}", headers={"If-Match": "*"})
        return response.status_code
