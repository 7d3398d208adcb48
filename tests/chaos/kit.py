"""A fleet to break, and what a user would notice while it breaks.

Every part is a real process started here: a PostgreSQL of the fleet's own (durable, not the
suite's fast one, since acknowledged writes must survive its kill -9), a three-member etcd
cluster, two control-plane replicas on both, and the example fleet's three regions, each an
agent with its simulated engines. Agents know both replicas' gRPC addresses, as they would
know a load balancer's; us-west reaches them through a proxy that can cut it off.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from controlplane.db import migrate
from controlplane.db.embedded import EmbeddedPostgres
from controlplane.db.engine import Database
from meridian import procs
from meridian.procs import ControlPlane, free_port, start_control_plane, stop_child
from tests.kits.agents import AgentProc, engines_ready, start_agent
from tests.kits.controlplane import ADMIN_TOKEN
from tests.kits.fleet import OPERATOR, applied_deployments, fleet_document
from tests.kits.fleet_docs import EXAMPLE
from tests.kits.push import eventually
from tests.report import add

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
JSON = {"Content-Type": "application/json"}
REGIONS = ("us-east", "us-west", "eu-west")
CUT_OFF = "us-west"  # the region whose link to the control plane goes through the proxy
LLAMA = "llama-3.1-8b-instruct"
SECTION = "chaos: what users saw while parts were killed"
_changes = itertools.count(1)


# --- etcd ------------------------------------------------------------------------------


@dataclass
class EtcdMember:
    name: str
    client: str  # host:port
    peer: str
    data_dir: Path
    process: asyncio.subprocess.Process | None = None


@dataclass
class Etcd:
    members: list[EtcdMember]

    @property
    def endpoints(self) -> str:
        return ",".join(m.client for m in self.members)

    async def start(self, member: EtcdMember, *, new: bool) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            pytest.fail("etcd is not installed; ./scripts/test installs Debian's etcd-server")
        cluster = ",".join(f"{m.name}=http://{m.peer}" for m in self.members)
        member.process = await procs.start_etcd_member(
            member.name, member.data_dir, member.client, member.peer, cluster, new=new,
            cluster_name="chaos", fast=True, log=member.data_dir.parent / f"{member.name}.log",
            binary=binary,
        )  # fmt: skip

    async def leader(self) -> EtcdMember:
        """The member that leads, as the members themselves say."""

        async def ask() -> EtcdMember | None:
            async with httpx.AsyncClient(timeout=2) as http:
                for member in self.members:
                    try:
                        status = (await http.post(f"http://{member.client}/v3/maintenance/status",
                                                  json={})).json()  # fmt: skip
                    except (httpx.HTTPError, ValueError):
                        continue
                    if status.get("leader") and status["leader"] == status["header"]["member_id"]:
                        return member
            return None

        found: EtcdMember = await eventually(ask, within_s=20)
        return found

    async def stop(self) -> None:
        for member in self.members:
            if member.process is not None and member.process.returncode is None:
                member.process.terminate()
                await member.process.wait()


async def etcd_cluster(root: Path, size: int = 3) -> Etcd:
    members = [
        EtcdMember(
            f"etcd{i}", f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}", root / f"etcd{i}"
        )
        for i in range(size)
    ]
    etcd = Etcd(members)
    for member in members:
        member.data_dir.mkdir(parents=True, exist_ok=True)
        await etcd.start(member, new=True)
    await etcd.leader()
    return etcd


# --- the proxy that can cut a region off -------------------------------------------------


class Proxy:
    """TCP to the first replica that answers. Cut, it accepts and reads but forwards nothing
    and answers nothing, as a partitioned network does; healed, it forwards again."""

    def __init__(self, upstreams: list[tuple[str, int]]) -> None:
        self.upstreams = upstreams
        self.cut = False
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()
        self._healed = asyncio.Event()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._links):
            writer.close()

    def cut_off(self) -> None:
        self.cut = True
        self._healed.clear()

    def heal(self) -> None:
        """Connections open across the cut are dropped: their bytes were lost."""
        self.cut = False
        self._healed.set()
        for writer in list(self._links):
            writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._links.add(writer)
        try:
            while self.cut:  # swallow what comes, answer nothing
                if not await reader.read(65536):
                    return
            upstream = await self._connect()
            if upstream is None:
                return
            up_reader, up_writer = upstream
            self._links.add(up_writer)
            await asyncio.gather(
                self._pump(reader, up_writer), self._pump(up_reader, writer),
                return_exceptions=True,
            )  # fmt: skip
        finally:
            self._links.discard(writer)
            writer.close()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        for host, port in self.upstreams:
            with contextlib.suppress(OSError):
                return await asyncio.open_connection(host, port)
        return None

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if self.cut:
                    await self._healed.wait()  # held, never delivered: dropped at heal
                    return
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()


# --- the fleet -----------------------------------------------------------------------------


@dataclass
class Fleet:
    root: Path
    postgres: EmbeddedPostgres
    db_url: str
    etcd: Etcd
    replicas: list[ControlPlane]
    replica_env: dict[str, str]
    agents: dict[str, AgentProc]
    agent_ports: dict[str, int]
    targets: dict[str, str]
    proxy: Proxy
    keys: dict[str, str]
    engines: dict[str, int]  # engines per region

    def admin(self, replica: int = 0) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.replicas[replica].url, headers=ADMIN, timeout=10)

    async def restart_replica(self, index: int) -> None:
        old = self.replicas[index]
        port = int(old.url.rsplit(":", 1)[1])
        grpc_port = int(old.grpc_target.rsplit(":", 1)[1])
        self.replicas[index] = await start_control_plane(
            self.replica_env, port=port, grpc_port=grpc_port, timeout_s=60
        )

    async def kill_agent(self, region: str) -> None:
        self.agents[region].process.kill()
        await self.agents[region].process.wait()

    async def start_agent(self, region: str, token: str | None = None) -> None:
        self.agents[region] = await start_agent(
            self.targets[region], region, self.root / "agents" / region, token=token,
            node=f"{region}-1", operator=OPERATOR, port=self.agent_ports[region],
            env={"MERIDIAN_AGENT_RESTART_BACKOFF_S": "0.2"},
        )  # fmt: skip

    async def ready(self, region: str) -> None:
        async def probe() -> bool:
            try:
                status = await self.agents[region].status()
            except (httpx.HTTPError, AssertionError):
                return False
            return engines_ready(status, self.engines[region]) and status["revision"] is not None

        await eventually(probe, within_s=60)

    async def revision(self) -> int:
        for index in range(len(self.replicas)):
            with contextlib.suppress(httpx.HTTPError):
                async with self.admin(index) as http:
                    return int((await http.get("/v1/revision")).json()["revision"])
        raise AssertionError("no replica answers")

    async def converged(self, within_s: float = 60) -> int:
        """Make a change every region's snapshot carries, and wait until every agent runs
        it; the revision."""
        # Each region gets its share of the quota (by GPUs); a step of 1,000 changes every
        # share, so every region's snapshot changes (an unchanged one is not sent again).
        # (out of reach: the senders go as fast as they can)
        quota = 10_000_000 + 1_000 * next(_changes)

        async def changed() -> int | None:
            for index in range(len(self.replicas)):
                with contextlib.suppress(httpx.HTTPError):
                    async with self.admin(index) as http:
                        answer = await http.patch("/v1/tenants/acme", headers={"If-Match": "*"},
                                                  json={"requests_per_minute": quota})  # fmt: skip
                        if answer.status_code == 200:
                            return int(answer.headers["X-Meridian-Revision"])
            return None

        revision: int = await eventually(changed, within_s=within_s)

        async def everywhere() -> bool:
            for agent in self.agents.values():
                try:
                    if ((await agent.status())["revision"] or 0) < revision:
                        return False
                except (httpx.HTTPError, AssertionError):
                    return False
            return True

        try:
            await eventually(everywhere, within_s=within_s)
        except TimeoutError:
            seen = {}
            for region, agent in self.agents.items():
                with contextlib.suppress(httpx.HTTPError, AssertionError):
                    status = await agent.status()
                    seen[region] = (status["revision"], status["control_plane"])
            raise AssertionError(f"agents short of revision {revision}: {seen}") from None
        return revision


@contextlib.asynccontextmanager
async def chaos_fleet(root: Path) -> AsyncIterator[Fleet]:
    await asyncio.to_thread(root.mkdir, parents=True, exist_ok=True)
    async with contextlib.AsyncExitStack() as stack:
        postgres = EmbeddedPostgres(root / "postgres")  # durable: fsync and synchronous commit
        credentials = await postgres.start()
        stack.push_async_callback(postgres.stop)
        db_url = credentials.url()
        db = Database.connect(db_url, pool_size=1)
        await migrate.upgrade(db.engine)
        await db.close()
        etcd = await etcd_cluster(root / "etcd")
        stack.push_async_callback(etcd.stop)
        env = {
            "MERIDIAN_DATABASE_URL": db_url, "MERIDIAN_ADMIN_TOKEN": ADMIN_TOKEN,
            "MERIDIAN_LOG_LEVEL": "warning", "MERIDIAN_ETCD_ENDPOINTS": etcd.endpoints,
            "MERIDIAN_ETCD_PREFIX": "/chaos", "MERIDIAN_LEASE_TTL_S": "3",
            "MERIDIAN_NODE_DOWN_AFTER_S": "3", "MERIDIAN_HEARTBEAT_TIMEOUT_S": "6",
            "MERIDIAN_KMS_KEY_FILE": str(root / "kek.json"),
        }  # fmt: skip
        replicas = list(await asyncio.gather(*(start_control_plane(env) for _ in range(2))))
        stack.push_async_callback(_stop_replicas, replicas)
        ports = {r: free_port() for r in REGIONS}
        document = yaml.safe_load(fleet_document(ports, _with_metered))
        async with httpx.AsyncClient(base_url=replicas[0].url, headers=ADMIN, timeout=30) as http:
            applied = await http.post("/v1/apply", content=yaml.safe_dump(document),
                                      headers={"Content-Type": "application/yaml"})  # fmt: skip
            assert applied.status_code == 200, applied.text
            keys = {}
            for tenant in ("acme", "eurobank", "metered"):
                made = await http.post("/v1/api-keys", json={"tenant": tenant})
                keys[tenant] = made.json()["key"]
            tokens = {}
            for region in REGIONS:
                made = await http.post("/v1/bootstrap-tokens", json={"region": region})
                tokens[region] = made.json()["token"]
        grpc = [_host_port(r.grpc_target) for r in replicas]
        proxy = Proxy(grpc)
        await proxy.start()
        stack.push_async_callback(proxy.close)
        both = "ipv4:" + ",".join(f"{h}:{p}" for h, p in grpc)
        targets = {r: both for r in REGIONS} | {CUT_OFF: f"127.0.0.1:{proxy.port}"}
        fleet = Fleet(root, postgres, db_url, etcd, replicas, env, {}, ports, targets, proxy,
                      keys, applied_deployments(document))  # fmt: skip
        stack.push_async_callback(_stop_agents, fleet)
        for region in REGIONS:
            await fleet.start_agent(region, tokens[region])
        for region in REGIONS:
            await fleet.ready(region)
        yield fleet


async def _stop_replicas(replicas: list[ControlPlane]) -> None:
    await asyncio.gather(*(stop_child(r.process) for r in replicas))


async def _stop_agents(fleet: Fleet) -> None:
    await asyncio.gather(*(agent.stop() for agent in fleet.agents.values()))


def _with_metered(doc: dict[str, Any]) -> None:
    doc["tenants"].append({"name": "metered", "tier": "standard", "requests_per_minute": 30})
    # the writes made under load go everywhere at once: they load the control plane while
    # its parts are killed, and a wave's bake would only make them wait (the rollout scenario
    # sets waves of its own)
    doc["rollout_policies"] = [{"name": "default", "strategy": "immediate"}]


def _host_port(target: str) -> tuple[str, int]:
    host, _, port = target.rpartition(":")
    return host, int(port)


# --- what a user notices -------------------------------------------------------------------


@dataclass
class Traffic:
    """Non-streamed chat completions into every region's gateway, `per_region` at a time,
    each sender resting `pause_s` between requests (a long scenario stays under the quota)."""

    fleet: Fleet
    per_region: int = 2
    regions: tuple[str, ...] = REGIONS
    pause_s: float = 0.0
    served: int = 0
    ids: list[str] = field(default_factory=list)  # of the requests served (X-Request-ID)
    failed: list[str] = field(default_factory=list)
    refused_bad_key: int = 0  # a key that never existed, asked throughout: 401 every time
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        for region in self.regions:
            for _ in range(self.per_region):
                self._tasks.append(asyncio.create_task(self._send(region)))
            self._tasks.append(asyncio.create_task(self._bad_key(region)))

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _send(self, region: str) -> None:
        url = f"http://127.0.0.1:{self.fleet.agent_ports[region]}/v1/chat/completions"
        headers = {"Authorization": f"Bearer {self.fleet.keys['acme']}"}
        body = {"model": LLAMA, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4}  # fmt: skip
        async with httpx.AsyncClient(timeout=30, headers=headers) as http:
            while not self._stop.is_set():
                try:
                    answer = await http.post(url, json=body)
                except httpx.HTTPError as error:
                    self.failed.append(f"{region}: {type(error).__name__}: {error}")
                    continue
                if answer.status_code == 200 and answer.json()["choices"]:
                    self.served += 1
                    self.ids.append(answer.headers["X-Request-ID"])
                else:
                    self.failed.append(f"{region}: {answer.status_code} {answer.text[:200]}")
                if self.pause_s:
                    await asyncio.sleep(self.pause_s)

    async def _bad_key(self, region: str) -> None:
        url = f"http://127.0.0.1:{self.fleet.agent_ports[region]}/v1/models"
        async with httpx.AsyncClient(timeout=10) as http:
            while not self._stop.is_set():
                try:
                    answer = await http.get(url, headers={"Authorization": "Bearer mk-nope.nope"})
                except httpx.HTTPError as error:
                    self.failed.append(f"{region}: a bad key: {type(error).__name__}")
                    await asyncio.sleep(0.2)
                    continue
                if answer.status_code == 401:
                    self.refused_bad_key += 1
                else:
                    self.failed.append(f"{region}: a bad key got {answer.status_code}")
                await asyncio.sleep(0.2)


@dataclass
class Writes:
    """Fleet documents applied through the admin API, each adding two clouds in one
    transaction, through whichever replica answers; the clouds of every write acknowledged
    must be there afterwards, and no write may be there by half."""

    fleet: Fleet
    acknowledged: list[int] = field(default_factory=list)
    attempted: list[int] = field(default_factory=list)
    refused: int = 0  # answered with an error (the database down): not acknowledged
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task

    async def _run(self) -> None:
        base = yaml.safe_load(EXAMPLE.read_text())["clouds"]
        n = 0
        while not self._stop.is_set():
            n += 1
            self.attempted.append(n)
            clouds = base + [
                {"name": f"chaos-{i}-{half}", "provider": "onprem"}
                for i in self.attempted for half in ("a", "b")
            ]  # fmt: skip
            body = json.dumps({"clouds": clouds})
            for index in (n % 2, (n + 1) % 2):
                try:
                    async with self.fleet.admin(index) as http:
                        answer = await http.post("/v1/apply", content=body, headers=JSON)
                except httpx.HTTPError:
                    continue  # not answered: maybe written, maybe not; not acknowledged
                if answer.status_code == 200:
                    self.acknowledged.append(n)
                else:
                    self.refused += 1
                break
            await asyncio.sleep(0.05)

    async def verify(self) -> int:
        """The acknowledged writes found (all of them, or this fails)."""

        async def names() -> set[str] | None:
            for index in range(len(self.fleet.replicas)):
                with contextlib.suppress(httpx.HTTPError):
                    async with self.fleet.admin(index) as http:
                        answer = await http.get("/v1/clouds?limit=500")
                        if answer.status_code == 200:
                            return {c["name"] for c in answer.json()["items"]}
            return None

        found: set[str] = await eventually(names, within_s=60)
        for n in self.attempted:
            halves = {f"chaos-{n}-a" in found, f"chaos-{n}-b" in found}
            assert len(halves) == 1, f"write {n} is there by half"
        lost = [n for n in self.acknowledged if f"chaos-{n}-a" not in found]
        assert not lost, f"acknowledged writes lost: {lost}"
        return len(self.acknowledged)


def report(scenario: str, traffic: Traffic, writes: Writes, found: int, revision: int) -> None:
    """A row of the run's chaos table."""
    add(SECTION, f"{scenario} | {traffic.served} | {len(traffic.failed)} | "
                 f"{traffic.refused_bad_key} | {len(writes.acknowledged)} | {found} | "
                 f"{writes.refused} | {revision}",
        header="scenario | requests served | failed | bad key refused | writes "
               "acknowledged | found | refused | agents converged to revision")  # fmt: skip


def kill9(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
