"""Kill every part of a running fleet, one at a time, under traffic and writes, and check what a
user would notice: requests that had a healthy path are served, auth and quotas hold from the
last snapshot, every acknowledged write is there afterwards (none by half), and every agent
converges to the newest revision. The scenarios share one fleet, in order; each heals what it
broke. The table at the end of the run counts what happened in each."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from controlplane.db.embedded import EmbeddedPostgres
from tests.chaos.kit import (
    CUT_OFF,
    LLAMA,
    REGIONS,
    Fleet,
    Traffic,
    Writes,
    kill9,
    report,
)
from tests.kits.push import eventually
from tests.kits.services import sql

BROKEN_S = 5.0  # how long each part stays dead under load


async def _under_load(
    fleet: Fleet, regions: tuple[str, ...] = REGIONS, pause_s: float = 0.0
) -> tuple[Traffic, Writes]:
    traffic, writes = Traffic(fleet, regions=regions, pause_s=pause_s), Writes(fleet)
    traffic.start()
    writes.start()
    await asyncio.sleep(2)  # a steady state first
    return traffic, writes


async def _settle(traffic: Traffic, writes: Writes) -> None:
    await asyncio.sleep(2)  # and some load after the heal
    await traffic.stop()
    await writes.stop()


async def _after(fleet: Fleet, traffic: Traffic, writes: Writes, scenario: str) -> int:
    """What every scenario checks once healed: nothing failed that had a healthy path, every
    acknowledged write is there, every agent runs the newest revision; the revision."""
    await _settle(traffic, writes)
    _no_failures(traffic)
    found = await writes.verify()
    revision = await fleet.converged()
    report(scenario, traffic, writes, found, revision)
    return revision


def _no_failures(traffic: Traffic) -> None:
    assert traffic.served > 0
    assert not traffic.failed, traffic.failed[:5]
    assert traffic.refused_bad_key > 0


async def test_a_control_plane_replica_killed(fleet: Fleet) -> None:
    traffic, writes = await _under_load(fleet)
    victim = fleet.replicas[0]
    kill9(victim.process.pid)
    await victim.process.wait()
    await _quota_holds(fleet, "us-east")
    await asyncio.sleep(BROKEN_S)
    await fleet.restart_replica(0)
    await _after(fleet, traffic, writes, "control-plane replica kill -9")


async def test_postgresql_killed(fleet: Fleet) -> None:
    traffic, writes = await _under_load(fleet)
    postmaster = int((fleet.postgres.pgdata / "postmaster.pid").read_text().split()[0])
    kill9(postmaster)
    await _quota_holds(fleet, "us-east")
    await asyncio.sleep(BROKEN_S)
    refused_while_down = writes.refused
    restarted = EmbeddedPostgres(fleet.root / "postgres")
    await restarted.start()
    fleet.postgres = restarted
    await _after(fleet, traffic, writes, "PostgreSQL kill -9")
    assert refused_while_down > 0, "no write was even tried while the database was down"
    await _each_recorded_once(fleet, traffic.ids)


async def _each_recorded_once(fleet: Fleet, ids: list[str]) -> None:
    """Every request served has one usage record where it was served: the records journaled
    while the database was down were shipped once it was back, and stored once each."""
    wanted = set(ids)
    assert len(wanted) == len(ids) > 0
    quoted = ", ".join("'" + i.replace("'", "''") + "'" for i in sorted(wanted))
    statement = ("SELECT request_id, count(*) FROM usage_records WHERE kind = 'served' "  # noqa: S608
                 f"AND request_id IN ({quoted}) GROUP BY request_id")  # fmt: skip
    try:
        async with asyncio.timeout(60):
            while True:
                rows = dict(await sql(fleet.db_url, statement))
                if set(rows) == wanted:
                    break
                await asyncio.sleep(0.5)
    except TimeoutError:
        total = await sql(fleet.db_url, "SELECT kind, count(*) FROM usage_records GROUP BY 1")
        missing = sorted(wanted - set(rows))
        raise AssertionError(
            f"{len(missing)} of {len(wanted)} with no record "
            f"(e.g. {missing[:3]}); the ledger holds {total}"
        ) from None
    assert set(rows.values()) == {1}, {k: v for k, v in rows.items() if v != 1}


async def test_the_etcd_leader_killed(fleet: Fleet) -> None:
    traffic, writes = await _under_load(fleet)
    leader = await fleet.etcd.leader()
    assert leader.process is not None
    kill9(leader.process.pid)
    await leader.process.wait()
    new_leader = await fleet.etcd.leader()
    assert new_leader is not leader
    await _quota_holds(fleet, "eu-west")
    await asyncio.sleep(BROKEN_S)
    await fleet.etcd.start(leader, new=False)
    await _after(fleet, traffic, writes, "etcd leader kill -9")


async def test_an_agent_killed(fleet: Fleet) -> None:
    """us-east's agent dies: the other regions serve on untouched; restarted on its data
    directory, it takes over its engines and serves before it hears from the control plane."""
    others = tuple(r for r in REGIONS if r != "us-east")
    traffic, writes = await _under_load(fleet, others)
    pids = [e["pid"] for e in (await fleet.agents["us-east"].status())["engines"]]
    await fleet.kill_agent("us-east")
    await _quota_holds(fleet, "eu-west")
    await asyncio.sleep(BROKEN_S)
    await fleet.start_agent("us-east")
    await fleet.ready("us-east")
    status = await fleet.agents["us-east"].status()
    assert sorted(e["pid"] for e in status["engines"]) == sorted(pids)  # adopted, not restarted
    await _after(fleet, traffic, writes, "agent kill -9")


async def test_an_engine_killed(fleet: Fleet) -> None:
    traffic, writes = await _under_load(fleet)
    engines = (await fleet.agents["eu-west"].status())["engines"]
    kill9(engines[0]["pid"])
    await _quota_holds(fleet, "eu-west")
    await asyncio.sleep(BROKEN_S)
    await fleet.ready("eu-west")  # restarted by its agent
    await _after(fleet, traffic, writes, "engine kill -9")


async def test_a_region_cut_off_from_the_control_plane(fleet: Fleet) -> None:
    """us-west loses the control plane (its packets dropped, not refused): it serves on, its
    auth and quotas from the last snapshot; healed, it catches up."""
    before = (await fleet.agents[CUT_OFF].status())["revision"]
    traffic, writes = await _under_load(fleet)
    fleet.proxy.cut_off()
    await asyncio.sleep(BROKEN_S)
    metered = await _metered(fleet, CUT_OFF, 20)
    fleet.proxy.heal()
    revision = await _after(fleet, traffic, writes, "region partitioned from the control plane")
    assert metered.count(200) > 0, metered  # its share of the tenant's quota, and no more
    assert metered.count(429) > 0, metered
    assert set(metered) <= {200, 429}, metered
    assert len(writes.acknowledged) > 0  # the control plane went on taking writes
    assert revision > before


async def _quota_holds(fleet: Fleet, region: str) -> None:
    """A tenant of 30 requests a minute, asked 40 times, more than its share here: some are
    refused with 429, none failed."""
    answers = await _metered(fleet, region, 40)
    assert set(answers) <= {200, 429}, answers
    assert answers.count(429) > 0, answers


async def _metered(fleet: Fleet, region: str, n: int) -> list[int]:
    url = f"http://127.0.0.1:{fleet.agent_ports[region]}/v1/chat/completions"
    body = {"model": LLAMA, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    headers = {"Authorization": f"Bearer {fleet.keys['metered']}"}
    async with httpx.AsyncClient(timeout=30, headers=headers) as http:
        return [(await http.post(url, json=body)).status_code for _ in range(n)]


async def test_a_malformed_snapshot_is_nacked_and_the_last_good_one_serves(
    fleet: Fleet,
) -> None:
    traffic, writes = await _under_load(fleet)
    async with fleet.admin() as http:
        path = "/v1/deployments/llama-eu-west"
        bad = await http.patch(path, json={"engine_args": {"mem-frac": 0.5}},
                               headers={"If-Match": "*"})  # fmt: skip
        assert bad.status_code == 200, bad.text

        async def nacked() -> str | None:
            node = (await http.get("/v1/nodes/eu-west-1")).json()
            reason: str | None = node["status"]["last_nack_reason"]
            return reason

        reason = await eventually(nacked, within_s=20)
        assert "mem-frac" in reason
        await asyncio.sleep(2)  # serving on the last good snapshot meanwhile
        good = await http.patch(path, json={"engine_args": None}, headers={"If-Match": "*"})
        assert good.status_code == 200, good.text
    await _after(fleet, traffic, writes, "malformed snapshot (nacked)")


async def test_a_truncated_snapshot_on_disk_is_set_aside(fleet: Fleet) -> None:
    """eu-west's agent stops; its snapshot file is cut in half; started again, it sets the
    file aside and runs what the control plane sends, not garbage."""
    await fleet.agents["eu-west"].stop()
    saved: Path = fleet.root / "agents" / "eu-west" / "snapshot.pb"
    data = await asyncio.to_thread(saved.read_bytes)
    await asyncio.to_thread(saved.write_bytes, data[: len(data) // 2])
    await fleet.start_agent("eu-west")
    await fleet.ready("eu-west")
    status = await fleet.agents["eu-west"].status()
    assert status["source"] == "control-plane"
    assert saved.with_suffix(".corrupt").exists()
    traffic, writes = await _under_load(fleet)
    await _after(fleet, traffic, writes, "truncated snapshot on disk")


async def test_a_rollout_goes_on_past_an_agent_its_leader_and_postgresql_killed(
    fleet: Fleet,
) -> None:
    """A good change rolls out in waves under traffic. Paused in its first wave, the agent of
    a region not yet updated is killed and restarted: it comes back at what it held. Resumed,
    the replica that leads is killed -9, then PostgreSQL in the next wave. The rollout ends
    complete, each wave pushed once and in order, nothing rolled back. Clients go to the
    regions whose agent stays up (us-east's own clients have no path while it is dead)."""
    others = tuple(r for r in REGIONS if r != "us-east")
    traffic, writes = await _under_load(fleet, others, pause_s=0.1)  # a minute or more
    async with fleet.admin(0) as http:
        policy = {"name": "default", "strategy": "waves", "bake_s": 6,
                  "checks": {"min_requests": 5, "wait_for_traffic_s": 120}}  # fmt: skip
        made = await http.put("/v1/rollout-policies/default", json=policy,
                              headers={"If-Match": "*"})  # fmt: skip
        assert made.status_code == 200, made.text
        changed = await http.patch("/v1/routing-policies/llama-default", headers={"If-Match": "*"},
                                   json={"slo_ttft_ms": 950})  # fmt: skip
        assert changed.status_code == 200, changed.text
        revision = int(changed.headers["X-Meridian-Revision"])
    rollout = await _rollout_at(fleet, revision, wave=0)
    assert [w["targets"] for w in rollout["waves"]] == [["region:us-west"], ["region:us-east"]]
    await _rollout(fleet, "pause")
    held = (await fleet.agents["us-east"].status())["revision"]
    await fleet.kill_agent("us-east")
    await fleet.start_agent("us-east")
    await fleet.ready("us-east")
    assert (await fleet.agents["us-east"].status())["revision"] == held
    await _rollout(fleet, "resume")

    leader = await _leader(fleet)
    kill9(fleet.replicas[leader].process.pid)
    await fleet.replicas[leader].process.wait()
    await _rollout_at(fleet, revision, wave=1)  # the new leader went on
    postmaster = int((fleet.postgres.pgdata / "postmaster.pid").read_text().split()[0])
    kill9(postmaster)
    await asyncio.sleep(3)
    restarted = EmbeddedPostgres(fleet.root / "postgres")
    await restarted.start()
    fleet.postgres = restarted
    await fleet.restart_replica(leader)
    done = await _rollout_at(fleet, revision, state="complete")
    async with fleet.admin(0) as http:
        events = (
            await http.get("/v1/audit-events", params={"kind": "rollout", "name": str(done["id"])})
        ).json()
    steps = [e["action"] for e in reversed(events["items"])]
    assert steps == ["begin", "wave", "pause", "resume", "wave", "complete"], steps
    await _after(fleet, traffic, writes, "rollout through kill -9 of its leader and PostgreSQL")


async def _leader(fleet: Fleet) -> int:
    async with fleet.admin(0) as http:
        cluster = (await http.get("/v1/cluster")).json()
    urls = [r["rest_url"] for r in cluster["replicas"] if r["id"] == cluster["leader"]]
    return next(i for i, r in enumerate(fleet.replicas) if r.url in urls)


async def _rollout(fleet: Fleet, action: str) -> None:
    async with fleet.admin(0) as http:
        answer = await http.post(f"/v1/rollouts/current/{action}")
        assert answer.status_code == 200, answer.text


async def _rollout_at(
    fleet: Fleet, revision: int, *, wave: int | None = None, state: str = "rolling"
) -> dict[str, Any]:
    """The rollout of `revision` once it reaches the wave (or the state), asked of any replica
    that answers; on a timeout, the last row seen."""
    seen: list[Any] = [None]

    async def there() -> dict[str, Any] | None:
        for index in range(len(fleet.replicas)):
            try:
                async with fleet.admin(index) as http:
                    row = (await http.get("/v1/rollouts")).json()["rollout"]
            except (httpx.HTTPError, ValueError, KeyError):
                continue
            seen[0] = row
            if (
                row
                and row["revision"] == revision
                and row["state"] == state
                and (wave is None or row["wave"] >= wave)
            ):
                return dict(row)
        return None

    try:
        found: dict[str, Any] = await eventually(there, within_s=90)
    except TimeoutError:
        views = await _cluster_views(fleet)
        raise AssertionError(
            f"not at wave {wave}, {state} in 90 s: {seen[0]}; the replicas' views: {views}"
        ) from None
    return found


async def _cluster_views(fleet: Fleet) -> list[Any]:
    """What each replica says of the cluster (who leads), or why it could not say."""
    views: list[Any] = []
    for index in range(len(fleet.replicas)):
        try:
            async with fleet.admin(index) as http:
                views.append((await http.get("/v1/cluster")).json())
        except (httpx.HTTPError, ValueError) as exc:
            views.append(repr(exc))
    return views
