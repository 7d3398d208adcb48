"""`meridian bench revocation`: from a revocation to the credential failing everywhere it is
checked, for the three kinds of credential, with and without a rollout under way.

A control plane on an embedded PostgreSQL and one agent per region, all real processes. Each
kind, each round:

- **API key**: a key is made and taken by every region; then revoked (`PATCH {"revoked":
  true}`), and every region's gateway is polled with it (every 2 ms) until it answers 401.
- **principal** (a service account's token): made, taken by the admin API; then deleted, and
  the admin API is polled with it until 401. Principals are checked by the control plane
  alone, in its database: no region holds them.
- **signing key**: the first region's key is rotated at once (`immediate`, as for a key
  thought compromised), and every peer region (its fallback rule names them all) is sent an
  escalated request signed with the old key (read from the database and opened with the key
  file, as a thief who had it would hold it) until it answers 401.

Then again with a rollout paused midway (a new fallback rule, its waves held by an operator):
revocations are security changes, sent to every region at once whatever rollout is under way.
The figure is the time from the start of the revoking request to the first refusal.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from meridian_pb.fleet.v1 import assertion as contract
from rich.console import Console
from rich.table import Table

from bench.harness import apply, start_agent, start_control_on_db
from bench.plots import write_json
from controlplane.db.engine import Database
from controlplane.services.sealing.sealer import sealer_for
from controlplane.services.sealing.signing import open_seeds, read_keys
from controlplane.settings import Settings
from controlplane.snapshot.keys import SIGNING
from meridian.procs import free_port

GOAL_P99_S = 1.0
POLL_S = 0.002
MODEL = "bench-model"
PROBE = b'{"model": "bench-model", "messages": [{"role": "user", "content": "hi"}]}'


@dataclass
class Options:
    regions: int = 3
    rounds: int = 20
    out: Path | None = None
    root: Path = Path(".")
    signing_rounds: int = 5


def fleet_document(regions: list[str], ports: dict[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "meridian/v1",
        "clouds": [{"name": "local", "provider": "onprem"}],
        "regions": [{"name": r, "cloud": "local", "geography": r, "jurisdiction": "local",
                     "gateway_url": f"http://127.0.0.1:{ports[r]}"} for r in regions],
        "nodes": [{"name": f"{r}-1", "region": r, "hostname": "127.0.0.1"} for r in regions],
        "tenants": [{"name": "bench", "tier": "standard"}],
        "models": [{"name": MODEL, "source": "bench/model", "context_length": 4096,
                    "min_gpu_memory_gb": 1}],
        "fallback_rules": [{"name": "first-out", "region": regions[0], "peers": regions[1:]}],
        # every change but a security one rolls out in waves, baked for ten minutes each
        "rollout_policies": [{"name": "default", "bake_s": 600,
                              "checks": {"min_requests": 10, "wait_for_traffic_s": 600}}],
    }  # fmt: skip


@dataclass
class Bench:
    admin: httpx.AsyncClient
    http: httpx.AsyncClient
    cp_url: str
    gateways: dict[str, str]
    db: Database
    settings: Settings
    rounds: int
    signing_rounds: int

    async def api_key(self) -> dict[str, list[float]]:
        times: dict[str, list[float]] = {r: [] for r in self.gateways}
        for _ in range(self.rounds):
            made = (await self.admin.post("/v1/api-keys", json={"tenant": "bench"})).json()
            key = made["key"]
            await self._everywhere(partial(self._key, key=key, status=200))
            revoke = self.admin.patch(f"/v1/api-keys/{made['name']}", json={"revoked": True},
                                      headers={"If-Match": "*"})  # fmt: skip
            await self._timed(times, revoke, partial(self._key, key=key, status=401))
        return times

    async def principal(self) -> dict[str, list[float]]:
        times: dict[str, list[float]] = {"control plane": []}
        for _ in range(self.rounds):
            body = {"name": f"svc-{secrets.token_hex(4)}", "role": "viewer"}
            made = await self.admin.post("/v1/principals", json=body)
            token = made.raise_for_status().json()["token"]
            await _until(self.http, self.cp_url, token, 200, "/v1/auth/whoami")
            started = time.monotonic()
            gone = asyncio.create_task(self.admin.delete(
                f"/v1/principals/{body['name']}", headers={"If-Match": "*"}))  # fmt: skip
            at = await _until(self.http, self.cp_url, token, 401, "/v1/auth/whoami")
            (await gone).raise_for_status()
            times["control plane"].append(at - started)
        return times

    async def signing_key(self) -> dict[str, list[float]]:
        origin, *peers = self.gateways
        times: dict[str, list[float]] = {r: [] for r in peers}
        for _ in range(self.signing_rounds):
            kid, key = await self._signing(origin)
            taken = partial(self._forged, origin=origin, kid=kid, key=key, refused=False)
            await self._everywhere(taken, peers)
            rotate = self.admin.post("/v1/signing-keys/rotate",
                                     json={"region": origin, "immediate": True})  # fmt: skip
            refused = partial(self._forged, origin=origin, kid=kid, key=key, refused=True)
            await self._timed(times, rotate, refused, peers)
        return times

    async def _key(self, region: str, key: str, status: int) -> float:
        return await _until(self.http, self.gateways[region], key, status)

    async def _signing(self, region: str) -> tuple[str, Ed25519PrivateKey]:
        """The key that signs the region's escalations now, opened from the database."""
        async with self.db.sessions() as session:
            (kid,) = [k.kid for k in (await read_keys(session))[region] if k.state == SIGNING]
            seeds = await open_seeds(session, sealer_for(self.settings), [kid])
        return kid, Ed25519PrivateKey.from_private_bytes(seeds[kid])

    async def _forged(
        self, region: str, origin: str, kid: str, key: Ed25519PrivateKey, refused: bool
    ) -> float:
        """When the region's gateway first took (`refused` False: anything but 401) or
        refused (401) an escalation signed as `origin` with `key`: a fresh assertion (its
        nonce) each time."""
        deadline = time.monotonic() + 30
        while True:
            rid = secrets.token_hex(8)
            signed = contract.payload(
                origin=origin, audience=region, key_id=kid, tenant="bench", request_id=rid,
                reason="overload", body=PROBE, debug=False, waited_ms=0,
                service_class="standard", now=time.time(),
            )  # fmt: skip
            headers = {contract.HEADER: contract.header(signed, key.sign(signed)),
                       "X-Request-ID": rid, "Content-Type": "application/json"}  # fmt: skip
            answer = await self.http.post(f"{self.gateways[region]}/v1/chat/completions",
                                          content=PROBE, headers=headers)  # fmt: skip
            if (answer.status_code == 401) == refused:
                return time.monotonic()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{region} still answers {answer.status_code} to {kid}")
            await asyncio.sleep(POLL_S)

    async def _everywhere(
        self, probe: Callable[[str], Awaitable[float]], regions: list[str] | None = None
    ) -> list[float]:
        names = regions if regions is not None else list(self.gateways)
        return list(await asyncio.gather(*(probe(r) for r in names)))

    async def _timed(
        self,
        times: dict[str, list[float]],
        revoking: Awaitable[httpx.Response],
        probe: Callable[[str], Awaitable[float]],
        regions: list[str] | None = None,
    ) -> None:
        started = time.monotonic()
        request = asyncio.ensure_future(revoking)
        failed = await self._everywhere(probe, regions)
        (await request).raise_for_status()
        for region, at in zip(regions or list(self.gateways), failed, strict=True):
            times[region].append(at - started)


async def run(options: Options) -> dict[str, Any]:
    console = Console(width=120)
    regions = [f"region-{i + 1}" for i in range(options.regions)]
    result: dict[str, Any] = {"regions": options.regions, "rounds": options.rounds,
                              "signing_rounds": options.signing_rounds,
                              "goal_p99_s": GOAL_P99_S, "phases": {}}  # fmt: skip
    async with AsyncExitStack() as stack:
        with console.status(f"starting a control plane and {len(regions)} regions' agents"):
            cp, admin, db_url = await start_control_on_db(stack, options.root)
            ports = {r: free_port() for r in regions}
            await apply(admin, fleet_document(regions, ports))
            operator = secrets.token_urlsafe(24)
            for r in regions:
                await start_agent(stack, options.root, cp, admin, r, f"{r}-1", operator, ports[r])
        db = Database.connect(db_url, pool_size=1)
        stack.push_async_callback(db.close)
        settings = Settings(database_url=db_url, kms_key_file=options.root / "kek.json")
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=5))
        bench = Bench(admin, http, cp.url, {r: f"http://127.0.0.1:{ports[r]}" for r in regions},
                      db, settings, options.rounds, options.signing_rounds)  # fmt: skip
        for phase in ("steady", "rollout paused"):
            if phase == "rollout paused":
                with console.status("a change rolling out, paused in its first wave"):
                    result["rollout"] = await _paused_rollout(admin, regions)
            measured: dict[str, Any] = {}
            for kind, measure in (("api key", bench.api_key), ("principal", bench.principal),
                                  ("signing key", bench.signing_key)):  # fmt: skip
                with console.status(f"{phase}: revoking {kind}s"):
                    times = await measure()
                measured[kind] = {
                    "all": _summary(sorted(t for ts in times.values() for t in ts)),
                    "by_where": {w: _summary(sorted(ts)) for w, ts in times.items()},
                }
            result["phases"][phase] = measured
            write_json(console, result, options.out)
        state = (await admin.get("/v1/rollouts")).json()["rollout"]["state"]
        result["rollout"]["state_at_the_end"] = state
        (await admin.post("/v1/rollouts/current/abort")).raise_for_status()
    _report(console, result)
    write_json(console, result, options.out)
    return result


async def _paused_rollout(admin: httpx.AsyncClient, regions: list[str]) -> dict[str, Any]:
    """A change of intent that changes regions' snapshots (a second fallback rule), rolling
    out; paused in its first wave."""
    rule = {"name": "second-out", "region": regions[1], "peers": [regions[-1]]}
    answer = await admin.post("/v1/apply", params={"prune": "false"},
                              json={"fallback_rules": [rule]})  # fmt: skip
    answer.raise_for_status()
    await asyncio.sleep(1)
    paused = await admin.post("/v1/rollouts/current/pause")
    if paused.status_code != 200:
        now = (await admin.get("/v1/rollouts")).text
        raise RuntimeError(f"the rollout cannot be paused: {paused.text}; {now}")
    rollout = (await admin.get("/v1/rollouts")).json()["rollout"]
    return {"revision": rollout["revision"], "state": rollout["state"]}


async def _until(
    http: httpx.AsyncClient, url: str, token: str, status: int, path: str = "/v1/models"
) -> float:
    """When `url` first answered `status` to the bearer token (monotonic clock)."""
    deadline = time.monotonic() + 30
    while True:
        answer = await http.get(f"{url}{path}", headers={"Authorization": f"Bearer {token}"})
        if answer.status_code == status:
            return time.monotonic()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} still answers {answer.status_code}, not {status}")
        await asyncio.sleep(POLL_S)


def _summary(values: list[float]) -> dict[str, float]:
    def at(q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))]

    return {
        "samples": len(values),
        "p50_s": round(at(0.5), 4),
        "p99_s": round(at(0.99), 4),
        "max_s": round(values[-1], 4),
    }


def _report(console: Console, result: dict[str, Any]) -> None:
    table = Table(title="from the revoking request to the credential refused (401)")
    for column in ("phase", "credential", "where", "samples", "p50 s", "p99 s", "max s"):
        table.add_column(column, justify="right")
    worst = 0.0
    for phase, kinds in result["phases"].items():
        for kind, measured in kinds.items():
            rows = {**measured["by_where"], "everywhere": measured["all"]}
            for where, s in rows.items():
                table.add_row(phase, kind, where, str(s["samples"]), f"{s['p50_s']:.3f}",
                              f"{s['p99_s']:.3f}", f"{s['max_s']:.3f}")  # fmt: skip
            worst = max(worst, measured["all"]["p99_s"])
    console.print(table)
    rollout = result.get("rollout", {})
    console.print(
        f"the rollout of revision {rollout.get('revision')} meanwhile: "
        f"{rollout.get('state')}, {rollout.get('state_at_the_end')} at the end"
    )
    verdict = "met" if worst <= result["goal_p99_s"] else "NOT met"
    console.print(f"goal: p99 ≤ {result['goal_p99_s']} s everywhere: {verdict} ({worst:.3f} s)")
