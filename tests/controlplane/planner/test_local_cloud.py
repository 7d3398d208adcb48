"""The local fleet's clouds (meridian/local_cloud.py), as `meridian up` runs them: a control
plane whose planner resizes a pool's group through them, and the machines they start are real
agents that join the pool with its GPUs and run its engines; a machine let go stops, and its
node leaves placement. All real processes, on PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from meridian.local_cloud import LocalCloud, LocalPool
from meridian.procs import free_port, stop_child
from tests.kits.controlplane import ADMIN_TOKEN, start_server
from tests.kits.fleet_docs import BASE
from tests.kits.push import ADMIN, eventually

POOL = LocalPool("west-spot", "eu-west", "acme-gpu/europe-west1-b/west-spot",
                 "1xH100-SXM-80GB:80", max_nodes=3, spot=True)  # fmt: skip


def _fleet(replicas: int) -> dict[str, Any]:
    return {
        **BASE,
        "node_pools": [{"name": POOL.name, "cloud": "gcp", "region": POOL.region,
                        "gpu_model": "H100-SXM-80GB", "gpus_per_node": 1,
                        "price_per_gpu_hour": 2.0, "spot": True, "max_nodes": 3,
                        "group": POOL.group}],
        "deployments": [{"name": "llama-west", "model": "llama-8b", "region": POOL.region,
                         "backend": "sim", "replicas": replicas}],
    }  # fmt: skip


@pytest_asyncio.fixture(loop_scope="session")
async def cloud(database_url: str, workdir: Path, request: Any) -> AsyncIterator[LocalCloud]:
    """A local cloud with the pools' groups (POOL unless the test names others), no machine
    yet, and a control plane resizing them."""
    data_dir = workdir / f"local-cloud-{request.node.name}"
    grpc_port = free_port()
    pools = getattr(request, "param", [POOL])
    cloud = LocalCloud(pools, [], data_dir=data_dir, log_dir=data_dir / "logs", api="",
                       admin_token=ADMIN_TOKEN, grpc_target=f"127.0.0.1:{grpc_port}")  # fmt: skip
    await cloud.start()
    server = await start_server(
        database_url, grpc_port=str(grpc_port), local_cloud_url=cloud.url,
        local_cloud_token=cloud.token, planner_period_s="1", planner_cooldown_s="0",
        planner_spot_short_s="3",
    )  # fmt: skip
    cloud.api = server.url
    try:
        yield cloud
    finally:
        await cloud.close()
        await stop_child(server.process)


async def _nodes(http: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in (await http.get("/v1/nodes")).json()["items"]}


async def test_the_planner_grows_a_local_pool_by_real_agents_and_lets_an_idle_one_go(
    cloud: LocalCloud,
) -> None:
    async with httpx.AsyncClient(base_url=cloud.api, headers=ADMIN, timeout=30) as http:
        assert (await http.post("/v1/apply", json=_fleet(replicas=2))).status_code == 200

        async def two_serving() -> bool:
            nodes = await _nodes(http)
            machines = [m for m in cloud.machines.values() if m.state == "running"]
            ready = [e for m in machines
                     for e in (await _status(m.hostname, m.port))["engines"]
                     if e["state"] == "ready"]  # fmt: skip
            return (
                len(machines) == 2
                and len(ready) == 2
                and all(nodes.get(m.id, {}).get("pool") == POOL.name for m in machines)
            )

        await _until(http, cloud, two_serving, within_s=90)
        nodes = await _nodes(http)
        assert sorted(nodes) == ["west-spot-1", "west-spot-2"]
        for node in nodes.values():  # each joined with the pool's GPU, simulated
            assert [(g["model"], g["memory_gb"]) for g in node["gpus"]] == [("H100-SXM-80GB", 80)]
        grown = await _audit(http, "grown")
        assert [e["after"]["target"] for e in grown] == [2], grown

        # one engine wanted now: one machine runs none, and goes
        kept = {m.id: m.process for m in cloud.machines.values()}
        assert (await http.post("/v1/apply", json=_fleet(replicas=1))).status_code == 200

        async def one_left() -> bool:
            return len(cloud.machines) == 1 and cloud.desired[POOL.group] == 1

        await _until(http, cloud, one_left, within_s=60)
        (left,) = cloud.machines
        (gone,) = set(kept) - {left}
        process = kept[gone]
        assert process is not None
        assert process.returncode is not None  # its agent stopped
        nodes = await _nodes(http)
        assert nodes[gone]["state"] == "disabled"  # out of placement, with why
        assert nodes[left]["state"] == "active"
        events = (await http.get("/v1/audit-events", params={"kind": "node"})).json()["items"]
        (change,) = [e for e in events if e["name"] == gone and e["action"] == "update"]
        assert "let go" in change["after"]["reason"], change
        status = await _status(cloud.machines[left].hostname, cloud.machines[left].port)
        assert [e["state"] for e in status["engines"]] == ["ready"]  # the one serving stayed


SHORT = LocalPool("west-spot", "eu-west", POOL.group, "1xH100-SXM-80GB:80", max_nodes=3,
                  capacity=1)  # fmt: skip
DEMAND = LocalPool("west-demand", "eu-west", "acme-gpu/europe-west1-b/west-demand",
                   "1xH100-SXM-80GB:80", max_nodes=3)  # fmt: skip


@pytest.mark.parametrize("cloud", [[SHORT, DEMAND]], indirect=True)
async def test_engines_start_on_demand_where_spot_is_short_and_one_stays_off_spot(
    cloud: LocalCloud,
) -> None:
    doc = _fleet(replicas=3)
    doc["node_pools"].append({**doc["node_pools"][0], "name": DEMAND.name, "spot": False,
                              "price_per_gpu_hour": 4.0, "group": DEMAND.group})  # fmt: skip
    async with httpx.AsyncClient(base_url=cloud.api, headers=ADMIN, timeout=30) as http:
        assert (await http.post("/v1/apply", json=doc)).status_code == 200

        async def three_serving() -> bool:
            machines = [m for m in cloud.machines.values() if m.state == "running"]
            ready = [e for m in machines
                     for e in (await _status(m.hostname, m.port))["engines"]
                     if e["state"] == "ready"]  # fmt: skip
            return len(ready) == 3

        await _until(http, cloud, three_serving, within_s=90)
        # one engine's GPU never spot; spot for the rest, but its cloud had one machine: the
        # rest on demand
        assert sorted(cloud.machines) == ["west-demand-1", "west-demand-2", "west-spot-1"]
        assert cloud.desired == {SHORT.group: 1, DEMAND.group: 2}
        events = await _audit(http, "grown") + await _audit(http, "shrunk")
        said = " | ".join(e["after"]["summary"] for e in events)
        assert "spot short: its cloud started 1 of 2" in said, said
        assert "(1 of them not spot)" in said, said
        status = await _status(cloud.machines["west-spot-1"].hostname,
                               cloud.machines["west-spot-1"].port)  # fmt: skip
        assert len(status["engines"]) == 1  # a preemption there takes one engine of three


async def test_a_preempted_machine_is_replaced_before_it_is_taken(cloud: LocalCloud) -> None:
    async with httpx.AsyncClient(base_url=cloud.api, headers=ADMIN, timeout=30) as http:
        assert (await http.post("/v1/apply", json=_fleet(replicas=2))).status_code == 200

        async def ready() -> list[str]:
            """The machines whose engine is ready."""
            return [m.id for m in list(cloud.machines.values()) if m.state == "running"
                    and [e["state"] for e in (await _status(m.hostname, m.port))["engines"]]
                    == ["ready"]]  # fmt: skip

        async def two_serving() -> bool:
            return len(await ready()) == 2

        await _until(http, cloud, two_serving, within_s=90)
        headers = {"Authorization": f"Bearer {cloud.token}"}
        async with httpx.AsyncClient(base_url=cloud.url, headers=headers, timeout=10) as c:
            taken = await c.post("/groups/preempt", params={"name": POOL.group, "notice_s": "20"})
        assert taken.status_code == 200, taken.text
        doomed = taken.json()["machine"]

        async def replaced_in_time() -> bool:  # a third machine serves, the doomed one is there
            serving = await ready()
            return doomed in cloud.machines and len([m for m in serving if m != doomed]) == 2

        await _until(http, cloud, replaced_in_time, within_s=20)
        nodes = await _nodes(http)
        assert nodes[doomed]["state"] == "draining"  # the notice took it out of placement
        grown = " | ".join(e["after"]["summary"] for e in await _audit(http, "grown"))
        assert "in place of machines whose nodes drain" in grown, grown

        async def taken_and_serving() -> bool:
            return doomed not in cloud.machines and len(await ready()) >= 2

        await _until(http, cloud, taken_and_serving, within_s=60)


async def _until(
    http: httpx.AsyncClient,
    cloud: LocalCloud,
    done: Callable[[], Awaitable[bool]],
    within_s: float,
) -> None:
    """`eventually`, and what the planner, the nodes and the machines were when it does not
    come."""
    try:
        await eventually(done, within_s=within_s)
    except TimeoutError:
        planner = (await http.get("/v1/planner")).json()
        logs = sorted(cloud.log_dir.glob("agent-*.log"))
        tails = "".join(f"\n--- {p.name}:\n{p.read_text()[-1500:]}" for p in logs)
        raise AssertionError(
            f"machines: {cloud.machines}; nodes: {await _nodes(http)}; planner: {planner}{tails}"
        ) from None


async def _status(host: str, port: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(timeout=5, headers=headers) as http:
        try:
            answer = await http.get(f"http://{host}:{port}/agent/status")
        except httpx.HTTPError:
            return {"engines": []}
        return answer.json() if answer.status_code == 200 else {"engines": []}


async def _audit(http: httpx.AsyncClient, action: str) -> list[dict[str, Any]]:
    events = (await http.get("/v1/audit-events", params={"kind": "planner"})).json()["items"]
    return [e for e in events if e["action"] == action]


async def test_the_local_cloud_refuses_what_a_cloud_would(cloud: LocalCloud) -> None:
    headers = {"Authorization": f"Bearer {cloud.token}"}
    async with httpx.AsyncClient(base_url=cloud.url, timeout=10) as http:
        assert (await http.get("/groups", params={"name": POOL.group})).status_code == 401
        http.headers.update(headers)
        answer = await http.get("/groups", params={"name": "nowhere"})
        assert answer.status_code == 404
        assert answer.json()["error"]["message"] == "no group 'nowhere' here"
        for body in ({"desired": 4}, {"desired": -1}, {"desired": "2"}, {"size": 1}):
            answer = await http.put("/groups/desired", params={"name": POOL.group}, json=body)
            assert answer.status_code == 400, body
        gone = {"name": POOL.group, "machine": "west-spot-9"}
        answer = await http.delete("/groups/machines", params=gone)
        assert answer.status_code == 404
        read = (await http.get("/groups", params={"name": POOL.group})).json()
        assert read == {"desired": 0, "machines": []}  # nothing refused changed anything
