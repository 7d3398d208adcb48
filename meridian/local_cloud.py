"""The local fleet's clouds: `meridian up` plays every cloud's groups of machines on this one
machine, so that the capacity planner grows and shrinks node pools here as it would on AWS or
GCP. Its control plane resizes them through it (controlplane/services/planner/providers/
local.py), told where by MERIDIAN_LOCAL_CLOUD_URL and MERIDIAN_LOCAL_CLOUD_TOKEN.

- Each node pool of the fleet document that names a `group` is a group here. Its machines
  are the document's nodes of that pool (their agents started by `meridian up`), and those
  grown since.
- A machine grown is a real agent process (`meridian agent run`) on a loopback address of
  its own (127.0.0.10 and up), registered with a bootstrap token of its pool, reporting the
  pool's GPUs (simulated: MERIDIAN_AGENT_SIMULATED_GPUS), named `<pool>-<n>`; n never
  repeats, so a machine's node is never one let go before.
- A pool's `capacity` (tests: a spot pool short of machines) bounds what it starts; its
  group goes on wanting the rest, as a cloud's does when it has none to give.
- A machine is `starting` until its agent answers, then `running`. Removing one stops its
  agent (it drains first), and its group wants one fewer; shrinking a group by its size
  stops its newest machines.
- The groups' sizes and the grown machines are kept in `<data dir>/local-cloud.json`: the
  next `meridian up` starts them again, as a cloud's machines outlive a console.
- A spot pool's machines can be taken back (`POST /groups/preempt`): the machine's agent
  reads the notice where this cloud gives it (`GET /machines/<id>/notice`, Meridian's URL
  shape for preemption notices), drains, and is killed at the notice's end; the group then
  starts another in its place, as a cloud's group keeps its size.
- It listens on loopback only, and answers nothing without its token but a machine's
  notice.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml
from aiohttp import web

from meridian import procs
from meridian.procs import free_port, stop_child

log = logging.getLogger(__name__)

FIRST_ADDRESS = ipaddress.IPv4Address("127.0.0.10")
MACHINE_STOP_GRACE_S = 30.0  # its agent drains its engines first
READY_TIMEOUT_S = 60.0
REPLACE_AFTER_S = 10.0
TAKEN_GRACE_S = 2.0


@dataclass(frozen=True)
class LocalPool:
    name: str
    region: str
    group: str
    gpus: str  # COUNTxMODEL:MEMORY_GB, as the agent's simulated_gpus
    max_nodes: int
    capacity: int | None = None  # machines the cloud has for it (spot runs short); None: any
    spot: bool = False  # its machines may be taken back (POST /groups/preempt)


@dataclass
class Machine:
    id: str
    pool: str
    hostname: str
    port: int = 0  # its agent's; 0 for a declared node's (up runs its agent)
    state: str = "starting"
    process: asyncio.subprocess.Process | None = field(default=None, repr=False)
    taken_at: float | None = None  # a preemption notice's deadline (seconds since the epoch)

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "state": self.state, "hostname": self.hostname}


def local_pools(fleet: Path) -> tuple[list[LocalPool], list[Machine]]:
    """The document's pools with a group, and its nodes of those pools as running machines."""
    doc: dict[str, Any] = yaml.safe_load(fleet.read_text()) or {}
    memory = {g["model"]: g["memory_gb"] for n in doc.get("nodes", []) for g in n.get("gpus", [])}
    pools = [
        LocalPool(p["name"], p["region"], p["group"],
                  f"{p['gpus_per_node']}x{p['gpu_model']}:{memory.get(p['gpu_model'], 80)}",
                  int(p["max_nodes"]), spot=bool(p.get("spot")))
        for p in doc.get("node_pools", []) if p.get("group")
    ]  # fmt: skip
    names = {p.name for p in pools}
    declared = [Machine(n["name"], n["pool"], n["hostname"], state="running")
                for n in doc.get("nodes", [])
                if n.get("pool") in names and n.get("state", "active") == "active"]  # fmt: skip
    return pools, declared


class LocalCloud:
    def __init__(
        self,
        pools: list[LocalPool],
        declared: list[Machine],
        *,
        data_dir: Path,
        log_dir: Path,
        api: str,
        admin_token: str,
        grpc_target: str,
    ) -> None:
        self.pools = {p.group: p for p in pools}
        self.machines: dict[str, Machine] = {m.id: m for m in declared}
        self.desired = {p.group: sum(m.pool == p.name for m in declared) for p in pools}
        self.next = dict.fromkeys((p.name for p in pools), 1)
        self.data_dir, self.log_dir = data_dir, log_dir
        self.api, self.admin_token, self.grpc_target = api, admin_token, grpc_target
        self.token = secrets.token_urlsafe(24)
        self.declared_processes: dict[str, asyncio.subprocess.Process] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: web.AppRunner | None = None
        self.url = ""

    @property
    def state_file(self) -> Path:
        return self.data_dir / "local-cloud.json"

    # -- life ------------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1") -> str:
        """Listening, with the grown machines of the last run started again; its URL."""
        await self._resume()
        app = web.Application(middlewares=[self._guard])
        app.add_routes([
            web.get("/groups", self._read),
            web.put("/groups/desired", self._resize),
            web.delete("/groups/machines", self._remove),
            web.post("/groups/preempt", self._preempt),
            web.get("/machines/{id}/notice", self._notice),
        ])  # fmt: skip
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, host, port).start()
        self.url = f"http://{host}:{port}"
        return self.url

    def adopt(self, node: str, process: asyncio.subprocess.Process) -> None:
        """A declared node's agent, started by `meridian up`: stopped if its machine goes."""
        self.declared_processes[node] = process

    async def close(self) -> None:
        """Its server stopped, and every machine it started (they drain at once)."""
        if self._runner is not None:
            await self._runner.cleanup()
        for task in self._tasks:
            task.cancel()
        grown = [m.process for m in self.machines.values() if m.process is not None]
        await asyncio.gather(*(stop_child(p, MACHINE_STOP_GRACE_S) for p in grown))

    # -- the API ---------------------------------------------------------------------------

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        # a machine's notice is its metadata service's: read without a token, as on a cloud
        opened = request.method == "GET" and request.path.endswith("/notice")
        if not opened and request.headers.get("Authorization") != f"Bearer {self.token}":
            return _refused(401, "no or a wrong bearer token")
        response: web.StreamResponse = await handler(request)
        return response

    def _group(self, request: web.Request) -> LocalPool | web.Response:
        name = request.query.get("name", "")
        pool = self.pools.get(name)
        return pool if pool is not None else _refused(404, f"no group {name!r} here")

    async def _read(self, request: web.Request) -> web.Response:
        pool = self._group(request)
        if isinstance(pool, web.Response):
            return pool
        machines = [m.as_json() for m in self.machines.values() if m.pool == pool.name]
        return web.json_response({"desired": self.desired[pool.group], "machines": machines})

    async def _resize(self, request: web.Request) -> web.Response:
        pool = self._group(request)
        if isinstance(pool, web.Response):
            return pool
        try:
            desired = (await request.json())["desired"]
        except (ValueError, KeyError, TypeError):
            return _refused(400, 'the body is {"desired": N}')
        if not isinstance(desired, int) or isinstance(desired, bool) or desired < 0:
            return _refused(400, f"desired is a count of machines, not {desired!r}")
        if desired > pool.max_nodes:
            return _refused(400, f"desired {desired} is above the group's maximum, "
                                 f"{pool.max_nodes}")  # fmt: skip
        self.desired[pool.group] = desired
        self._top_up(pool)  # a group short of capacity keeps wanting the rest
        for machine in reversed(self._live(pool)[desired:]):  # the newest go first
            self._stop(machine)
        await self._save()
        return web.json_response({"desired": desired})

    async def _remove(self, request: web.Request) -> web.Response:
        pool = self._group(request)
        if isinstance(pool, web.Response):
            return pool
        machine = self.machines.get(request.query.get("machine", ""))
        if machine is None or machine.pool != pool.name:
            return _refused(404, f"no machine {request.query.get('machine')!r} in this group")
        if machine.state != "stopping":
            self.desired[pool.group] = max(0, self.desired[pool.group] - 1)
            self._stop(machine)
            await self._save()
        return web.json_response({"desired": self.desired[pool.group]})

    async def _preempt(self, request: web.Request) -> web.Response:
        """A spot machine taken back: `machine` (default: the group's newest running one)
        gets a notice now, `notice_s` ahead (default 30, GCP's), and is taken at its end;
        the group, still wanting as many, starts another in its place then."""
        pool = self._group(request)
        if isinstance(pool, web.Response):
            return pool
        if not pool.spot:
            return _refused(400, f"pool {pool.name} is not spot: its machines are not taken back")
        try:
            notice_s = float(request.query.get("notice_s", "30"))
        except ValueError:
            return _refused(400, "notice_s is seconds")
        if not 0 <= notice_s <= 600:
            return _refused(400, "notice_s is between 0 and 600")
        running = [m for m in self._live(pool) if m.state == "running" and m.taken_at is None]
        named = request.query.get("machine")
        chosen = [m for m in running if m.id == named] if named else running[-1:]
        if not chosen:
            return _refused(404, f"no running machine {named or ''} to take in this group")
        machine = chosen[0]
        machine.taken_at = time.time() + notice_s
        log.info("local cloud: %s gets a preemption notice, taken in %.0f s", machine.id,
                 notice_s)  # fmt: skip
        self._spawn(self._take(machine, pool, notice_s))
        return web.json_response({"machine": machine.id, "taken_at": machine.taken_at})

    async def _notice(self, request: web.Request) -> web.Response:
        machine = self.machines.get(request.match_info["id"])
        if machine is None or machine.taken_at is None:
            return _refused(404, "no notice")
        when = datetime.fromtimestamp(machine.taken_at, UTC).isoformat()
        return web.json_response({"time": when})

    async def _take(self, machine: Machine, pool: LocalPool, notice_s: float) -> None:
        await asyncio.sleep(notice_s)
        if machine.state == "stopping":
            return
        machine.state = "stopping"
        process = machine.process or self.declared_processes.get(machine.id)
        if process is not None:  # taken: no drain beyond what the notice gave (the agent
            # drained at the notice; a short grace stops what it still runs, as the machine's
            # end would, rather than leave its engines orphaned on this one)
            await stop_child(process, TAKEN_GRACE_S)
        self.machines.pop(machine.id, None)
        self._top_up(pool)  # the group keeps its size: another in its place
        await self._save()

    # -- machines --------------------------------------------------------------------------

    def _live(self, pool: LocalPool) -> list[Machine]:
        return [m for m in self.machines.values() if m.pool == pool.name and m.state != "stopping"]

    def _top_up(self, pool: LocalPool) -> None:
        """Machines started until the group has as many as it wants, or as its capacity
        allows."""
        want = self.desired[pool.group]
        room = want if pool.capacity is None else min(want, pool.capacity)
        for _ in range(room - len(self._live(pool))):
            self._grow(pool)

    def _grow(self, pool: LocalPool) -> Machine:
        n = self.next[pool.name]
        self.next[pool.name] = n + 1
        machine = Machine(f"{pool.name}-{n}", pool.name, self._free_address(), free_port())
        self.machines[machine.id] = machine
        self._spawn(self._boot(machine, pool, fresh=True))
        log.info("local cloud: pool %s grows by %s", pool.name, machine.id)
        return machine

    def _stop(self, machine: Machine) -> None:
        machine.state = "stopping"
        process = machine.process or self.declared_processes.get(machine.id)
        log.info("local cloud: %s is let go", machine.id)

        async def stop() -> None:
            if process is not None:
                await stop_child(process, MACHINE_STOP_GRACE_S)
            self.machines.pop(machine.id, None)
            await self._save()

        self._spawn(stop())

    async def _boot(self, machine: Machine, pool: LocalPool, *, fresh: bool) -> None:
        """Its agent started. A machine that cannot start is gone from its group, and
        another takes its place a little later, as a cloud keeps a group at its size."""
        try:
            await self._start_agent(machine, pool, fresh=fresh)
        except Exception:
            log.exception("local cloud: machine %s did not start", machine.id)
            if machine.process is not None:
                await stop_child(machine.process)
            self.machines.pop(machine.id, None)
            await self._save()
            await asyncio.sleep(REPLACE_AFTER_S)
            self._top_up(pool)

    async def _start_agent(self, machine: Machine, pool: LocalPool, *, fresh: bool) -> None:
        token = await self._bootstrap_token(pool) if fresh else None
        child = await procs.start_agent(
            self.grpc_target, pool.region, self.data_dir / "agents" / machine.id,
            node=machine.id, hostname=machine.hostname, host=machine.hostname,
            port=machine.port, bootstrap_token=token, operator_token=self.admin_token,
            env=self._agent_env(machine, pool),
            log=self.log_dir / f"agent-{machine.id}.log", ready_timeout_s=None,
        )  # fmt: skip
        machine.process = child.process
        if machine.state == "stopping":  # let go while it started
            await stop_child(child.process, MACHINE_STOP_GRACE_S)
            return
        await procs.wait_ready(child.url, child.process, READY_TIMEOUT_S, path="/healthz",
                               what="a machine's agent")  # fmt: skip
        if machine.state == "starting":
            machine.state = "running"

    def _agent_env(self, machine: Machine, pool: LocalPool) -> dict[str, str]:
        return {
            "MERIDIAN_AGENT_SIMULATED_GPUS": pool.gpus,
            "MERIDIAN_AGENT_CONTROL_PLANE_URL": self.api,
            **self._notices(machine, pool),
        }

    def _notices(self, machine: Machine, pool: LocalPool) -> dict[str, str]:
        """A spot machine's agent watches for notices where this cloud gives them."""
        if not pool.spot:
            return {}
        return {"MERIDIAN_AGENT_PREEMPTION_NOTICES": f"{self.url}/machines/{machine.id}/notice",
                "MERIDIAN_AGENT_PREEMPTION_POLL_S": "1"}  # fmt: skip

    def agents(self, region: str) -> list[tuple[str, int]]:
        """Where the agents of the machines it started in a region listen, those running."""
        regions = {p.name: p.region for p in self.pools.values()}
        return [(m.hostname, m.port) for m in self.machines.values()
                if m.port and m.state == "running" and regions[m.pool] == region]  # fmt: skip

    def declared_env(self) -> dict[str, dict[str, str]]:
        """What the agents `meridian up` starts for the document's nodes must be told: where
        a spot machine's notice comes."""
        by_name = {p.name: p for p in self.pools.values()}
        return {m.id: self._notices(m, by_name[m.pool]) for m in self.machines.values()
                if not m.port}  # fmt: skip

    async def _bootstrap_token(self, pool: LocalPool) -> str:
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        async with httpx.AsyncClient(base_url=self.api, headers=headers, timeout=30) as http:
            answer = await http.post("/v1/bootstrap-tokens",
                                     json={"region": pool.region, "pool": pool.name})  # fmt: skip
            answer.raise_for_status()
            return str(answer.json()["token"])

    def _free_address(self) -> str:
        taken = {m.hostname for m in self.machines.values()}
        address = FIRST_ADDRESS
        while str(address) in taken:
            address += 1
        return str(address)

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(self._logged(work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _logged(work: Any) -> None:
        try:
            await work
        except Exception:
            log.exception("local cloud: a machine failed to start or stop")

    # -- kept across runs ------------------------------------------------------------------

    async def _save(self) -> None:
        grown = [{"id": m.id, "pool": m.pool, "hostname": m.hostname, "port": m.port}
                 for m in self.machines.values() if m.port and m.state != "stopping"]  # fmt: skip
        doc = {"desired": self.desired, "next": self.next, "machines": grown}
        await asyncio.to_thread(_write_json, self.state_file, doc)

    async def _resume(self) -> None:
        with contextlib.suppress(FileNotFoundError, ValueError):
            doc = json.loads(await asyncio.to_thread(self.state_file.read_text))
            by_name = {p.name: p for p in self.pools.values()}
            for name, n in doc.get("next", {}).items():
                if name in self.next:
                    self.next[name] = max(self.next[name], int(n))
            for kept in doc.get("machines", []):
                pool = by_name.get(kept["pool"])
                if pool is None or kept["id"] in self.machines:
                    continue
                machine = Machine(kept["id"], pool.name, kept["hostname"], int(kept["port"]))
                self.machines[machine.id] = machine
                self.desired[pool.group] += 1
                known = (self.data_dir / "agents" / machine.id / "identity.json").exists()
                self._spawn(self._boot(machine, pool, fresh=not known))  # one never joined: a token


def _refused(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)
