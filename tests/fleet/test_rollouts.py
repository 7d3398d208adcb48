"""A change rolls out in waves under steady traffic: a harmful one is caught at the canary and
rolled back without the other regions ever holding it, a good one reaches every region, and
an operator pauses, resumes, promotes and aborts from the CLI while a revoked key still goes
everywhere at once. Real processes: PostgreSQL, a control plane, three agents, simulators."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.kits.controlplane import ADMIN_TOKEN, run_cli
from tests.kits.fleet import LLAMA, Fleet, fleet_of
from tests.kits.fleet_docs import example
from tests.kits.push import ADMIN, eventually

REGIONS = ("us-east", "us-west", "eu-west")
# llama's engine arguments in the example fleet (the same in each region)
EXAMPLE_ARGS: dict[str, Any] = next(
    d for d in example()["deployments"] if d["name"] == "llama-us-east"
).get("engine_args", {})
POLICY = {
    "name": "default",
    "canary": "node",
    "waves": [{"count": 1}, {"percent": 100}],
    "bake_s": 3,
    "checks": {"min_requests": 10, "wait_for_traffic_s": 60},
}


IDLE = "mistral-7b-instruct"  # a model nobody calls, as most of a real fleet's are at any hour
IDLE_DEPLOYMENT = {"name": "mistral-us-east", "model": IDLE, "region": "us-east",
                   "backend": "sim", "replicas": 1}  # fmt: skip


def _waves(doc: dict[str, Any]) -> None:
    doc["rollout_policies"] = [POLICY]
    for tenant in doc["tenants"]:  # no tenant's own quota in the way of the traffic
        tenant["requests_per_minute"] = 1_000_000
    doc["models"].append({"name": IDLE, "source": "mistralai/Mistral-7B-Instruct-v0.3",
                          "context_length": 32768, "capabilities": ["chat", "completion"],
                          "min_gpu_memory_gb": 16})  # fmt: skip
    doc["deployments"].append(IDLE_DEPLOYMENT)


class Traffic:
    """Short streams to every region, a few at a time, until stopped: what each region
    answered, by status. `hold`: each client asks once for a stream and holds it, reading
    nothing, until stopped (a long answer held open costs the machine little: the engine's
    output waits for the reader)."""

    def __init__(
        self, fleet: Fleet, per_region: int = 3, tenant: str = "acme",
        regions: tuple[str, ...] = REGIONS, max_tokens: int = 6, hold: bool = False,
    ) -> None:  # fmt: skip
        self.answers: dict[str, Counter[str]] = {r: Counter() for r in REGIONS}
        self._stop = asyncio.Event()
        self._hold = hold
        self._tasks = [
            asyncio.ensure_future(self._loop(region, fleet.client(region, tenant), max_tokens))
            for region in regions
            for _ in range(per_region)
        ]

    async def _loop(self, region: str, client: openai.AsyncOpenAI, max_tokens: int) -> None:
        while not self._stop.is_set():
            try:
                stream = await client.chat.completions.create(
                    model=LLAMA, messages=[{"role": "user", "content": "hello there"}],
                    max_tokens=max_tokens, stream=True,
                )  # fmt: skip
                if self._hold:
                    await self._stop.wait()
                async for _ in stream:
                    if self._stop.is_set():
                        await stream.close()  # the gateway aborts it at the engine
                        break
                self.answers[region]["ok"] += 1
            except openai.APIStatusError as error:
                self.answers[region][f"{error.status_code} {error.code}"] += 1
                if self._hold:  # a client that holds a long answer asks for one, not a storm
                    await self._stop.wait()
                await asyncio.sleep(0.05)
            except openai.APIError:
                self.answers[region]["broken"] += 1
                await asyncio.sleep(0.05)

    def since(self, mark: dict[str, Counter[str]]) -> dict[str, Counter[str]]:
        return {r: self.answers[r] - mark[r] for r in REGIONS}

    def mark(self) -> dict[str, Counter[str]]:
        return {r: Counter(self.answers[r]) for r in REGIONS}

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


@contextlib.asynccontextmanager
async def traffic(fleet: Fleet, **kwargs: Any) -> AsyncIterator[Traffic]:
    running = Traffic(fleet, **kwargs)
    try:
        yield running
    finally:
        await running.stop()


async def apply(fleet: Fleet, **kinds: list[dict[str, Any]]) -> int:
    """Create or update the objects given (nothing else is touched); the revision."""
    async with httpx.AsyncClient(base_url=fleet.cp.url, headers=ADMIN, timeout=30) as http:
        answer = await http.post("/v1/apply", params={"prune": "false"}, json=kinds)
        assert answer.status_code == 200, answer.text
        return int(answer.json()["revision"])


async def rollouts(fleet: Fleet) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=fleet.cp.url, headers=ADMIN, timeout=30) as http:
        answer = await http.get("/v1/rollouts")
        assert answer.status_code == 200, answer.text
        doc: dict[str, Any] = answer.json()
        return doc


async def ended(fleet: Fleet, revision: int, within_s: float = 90) -> dict[str, Any]:
    """The rollout of `revision` once it has ended (the view then)."""

    last: dict[str, Any] = {}

    async def over() -> dict[str, Any] | None:
        doc = last["doc"] = await rollouts(fleet)
        row = doc["rollout"]
        if row and row["revision"] == revision and row["state"] not in ("rolling", "paused"):
            return doc
        return None

    try:
        done: dict[str, Any] = await eventually(over, within_s=within_s)
    except TimeoutError:
        row = last.get("doc", {}).get("rollout") or {}
        raise AssertionError(
            f"revision {revision}'s rollout has not ended: {row.get('state')}, "
            f"{row.get('reason')}; checks {row.get('checks')}"
        ) from None
    return done


LLAMA_DEFAULT = {"name": "llama-default", "model": LLAMA, "policy": "cost", "slo_ttft_ms": 800,
                 "slo_itl_ms": 60, "max_queue": 256}  # fmt: skip


LLAMA_EU_WEST = {"name": "llama-eu-west", "model": LLAMA, "region": "eu-west", "policy": "cost",
                 "slo_ttft_ms": 600, "slo_itl_ms": 50, "max_queue": 128}  # fmt: skip


async def _heard_from(fleet: Fleet, node: str, *, after: datetime) -> None:
    """Until the control plane has a heartbeat of `node` observed after `after`."""

    async def heard() -> bool:
        async with httpx.AsyncClient(base_url=fleet.cp.url, headers=ADMIN) as http:
            at = (await http.get(f"/v1/nodes/{node}")).json()["status"]["last_heartbeat_at"]
        return at is not None and datetime.fromisoformat(at) > after

    await eventually(heard, within_s=20)


# Its verdicts are judged from latencies and shares of refusals under load, in bakes of a few
# seconds: timing is what it tests, so it runs with nothing beside it (scripts/test).
@pytest.mark.alone
async def test_a_harmful_change_stops_at_the_canary_and_a_good_one_reaches_every_region(
    waved_database_url: str, tmp_path: Path
) -> None:
    async with (
        fleet_of(waved_database_url, tmp_path, REGIONS, _waves) as fleet,
        traffic(fleet) as load,
    ):
        await asyncio.sleep(3)  # a baseline of steady traffic
        east_pids = {e["pid"] for e in (await fleet.status("us-east"))["engines"]}

        # 1. Admission limits so low that most requests get 429: llama's model-wide policy
        # (us-east and us-west; eu-west has its own). us-west, the smaller, is the canary.
        mark = load.mark()
        bad = await apply(fleet, routing_policies=[{**LLAMA_DEFAULT, "max_inflight": 1,
                                                    "max_queue": 0}])  # fmt: skip
        doc = await ended(fleet, bad)
        row = doc["rollout"]
        assert row["state"] == "rolled_back", row
        assert row["reason"].startswith(("refusals of llama", "escalated of llama")), row["reason"]
        assert [w["targets"] for w in row["waves"]] == [["region:us-west"], ["region:us-east"]]
        assert [w["status"] for w in row["waves"]] == ["rolled_back", "pending"]
        seen = load.since(mark)
        assert not seen["us-east"] - Counter(ok=seen["us-east"]["ok"]), seen  # never held it
        assert doc["in_force"]["intent"] == row["base"], doc["in_force"]

        # 2. Engine arguments the agents refuse (a nack), then engines that crash as they
        # start, in every region at once (one revision each), beside the example's own (LoRA)
        def deployments(args: dict[str, Any]) -> list[dict[str, Any]]:
            return [
                {"name": f"llama-{r}", "model": LLAMA, "region": r, "backend": "sim",
                 "replicas": 2 if r == "eu-west" else 1, "engine_args": {**EXAMPLE_ARGS, **args}}
                for r in REGIONS
            ]  # fmt: skip

        refused = await apply(fleet, deployments=deployments({"no-such-flag": 1}))
        row = (await ended(fleet, refused))["rollout"]
        assert row["state"] == "rolled_back", row
        assert row["reason"].startswith("nack: us-west-1 refused it"), row["reason"]
        crash = await apply(fleet, deployments=deployments({"crash-after-s": 0.3}))
        row = (await ended(fleet, crash))["rollout"]
        assert row["state"] == "rolled_back", row
        assert row["reason"].startswith(("engines", "escalated", "errors")), row["reason"]
        assert [w["status"] for w in row["waves"]][1:] == ["pending"] * (len(row["waves"]) - 1)
        assert {e["pid"] for e in (await fleet.status("us-east"))["engines"]} == east_pids

        async def canary_serves_again() -> bool:
            engines = (await fleet.status("us-west"))["engines"]
            return bool(engines) and all(e["state"] == "ready" for e in engines)

        await eventually(canary_serves_again, within_s=30)

        # 3. Engines 30 times slower: the canary's TTFT goes past the SLO (and its overflow
        # to its peers past what they did before).
        slow = await apply(fleet, deployments=deployments({"slow-factor": 30}))
        row = (await ended(fleet, slow))["rollout"]
        assert row["state"] == "rolled_back", row
        assert row["reason"].startswith(("ttft_slo", "escalated", "itl_slo")), row["reason"]
        assert {e["pid"] for e in (await fleet.status("us-east"))["engines"]} == east_pids
        await eventually(canary_serves_again, within_s=30)
        # and its agent reported what happened while its engine restarted (escalations, each
        # heartbeat's counts lagging by up to a heartbeat): the good change's wave must not
        # be judged on them
        await _heard_from(fleet, "us-west-1", after=datetime.now(UTC) + timedelta(seconds=1))

        # 4. A good change (and the fix of the refused ones): every region, wave after wave.
        good = await apply(fleet, deployments=deployments({}),
                           routing_policies=[{**LLAMA_DEFAULT, "slo_ttft_ms": 900}])  # fmt: skip
        mark = load.mark()
        doc = await ended(fleet, good, within_s=120)
        row = doc["rollout"]
        assert row["state"] == "complete", (row["reason"], row["checks"])
        assert all(w["status"] == "done" for w in row["waves"]), row["waves"]
        assert {t["region"]: t["holds"] for t in doc["targets"]} == dict.fromkeys(
            sorted(REGIONS), good
        )
        assert all(c["verdict"] == "pass" for c in row["checks"]), row["checks"]
        # the idle model is not what it changed: nothing waited for its traffic
        assert {c["model"] for c in row["checks"]} <= {LLAMA, None}, row["checks"]
        assert all(w["models"] == [LLAMA] for w in row["waves"]), row["waves"]
        seen = load.since(mark)
        assert all(seen[r]["ok"] > 0 and list(seen[r]) == ["ok"] for r in REGIONS), seen

        # 5. A change to the idle model's deployment: judged by its engines and nacks (it has
        # no traffic on either side, and says so), and complete with no operator.
        idle = await apply(
            fleet, deployments=[{**IDLE_DEPLOYMENT, "engine_args": {"max-running-requests": 64}}]
        )
        row = (await ended(fleet, idle, within_s=60))["rollout"]
        assert row["state"] == "complete", (row["reason"], row["checks"])
        assert [w["models"] for w in row["waves"]] == [[IDLE]], row["waves"]
        verdicts = {(c["check"], c["model"]): c["verdict"] for c in row["checks"]}
        assert verdicts == {("nack", None): "pass", ("engines", None): "pass",
                            ("traffic", IDLE): "pass"}, row["checks"]  # fmt: skip

        # 6. Issue 40 §3: a harmless change to eu-west's own policy while acme holds ten
        # streams of 100,000 tokens there through the bake (held, unread: read, they would
        # take a slow machine's CPU from everything else), beside eurobank's traffic. Every
        # answer beside the streams meets a load the baseline never had: not the change's
        # doing, so it is not rolled back; once answers at the load the baseline had come, it
        # completes.
        async with traffic(fleet, tenant="eurobank", regions=("eu-west",)) as bank:
            await asyncio.sleep(3)  # a baseline of eu-west's traffic
            async with traffic(
                fleet, per_region=10, regions=("eu-west",), max_tokens=100_000, hold=True
            ):
                await asyncio.sleep(1)
                harmless = await apply(fleet, routing_policies=[{**LLAMA_EU_WEST,
                                                                 "slo_ttft_ms": 650}])  # fmt: skip
                await asyncio.sleep(10)  # its bake (3 s), and judging, under acme's streams
                row = (await rollouts(fleet))["rollout"]
                assert row["revision"] == harmless, row
                assert row["state"] in ("rolling", "complete"), (row["reason"], row["checks"])
            row = (await ended(fleet, harmless, within_s=60))["rollout"]
        assert row["state"] == "complete", (row["reason"], row["checks"])
        assert [w["targets"] for w in row["waves"]] == [["region:eu-west"]], row["waves"]
        served = bank.answers["eu-west"]
        assert served["ok"] >= 0.9 * sum(served.values()), served


async def test_operators_pause_resume_promote_and_abort_while_revocation_goes_everywhere(
    waved_database_url: str, tmp_path: Path
) -> None:
    async with (
        fleet_of(waved_database_url, tmp_path, REGIONS, _waves) as fleet,
        traffic(fleet) as load,
    ):
        env = {"MERIDIAN_URL": fleet.cp.url, "MERIDIAN_TOKEN": ADMIN_TOKEN}
        async with httpx.AsyncClient(base_url=fleet.cp.url, headers=ADMIN, timeout=30) as http:
            made = (await http.post("/v1/api-keys", json={"tenant": "acme"})).json()
            tenant = await http.post("/v1/tenants", json={"name": "contractor"})
            assert tenant.status_code == 201, tenant.text
            theirs = (await http.post("/v1/api-keys", json={"tenant": "contractor"})).json()

        first = await apply(fleet, routing_policies=[{**LLAMA_DEFAULT, "slo_ttft_ms": 901}])
        code, out = await run_cli("rollout", "pause", env=env)
        assert code == 0, out
        assert "paused" in out, out

        # While the rollout is paused, a key revoked and a tenant disabled: every region
        # refuses them at once.
        async with httpx.AsyncClient(base_url=fleet.cp.url, headers=ADMIN, timeout=30) as http:
            for path, body in ((f"/v1/api-keys/{made['name']}", {"revoked": True}),
                               ("/v1/tenants/contractor", {"disabled": True})):  # fmt: skip
                answer = await http.patch(path, json=body, headers={"If-Match": "*"})
                assert answer.status_code == 200, answer.text
        for region in REGIONS:
            for key, refusal in ((made["key"], openai.AuthenticationError),
                                 (theirs["key"], openai.PermissionDeniedError)):  # fmt: skip
                client = openai.AsyncOpenAI(base_url=f"{fleet.agents[region].url}/v1",
                                            api_key=key, max_retries=0)  # fmt: skip

                async def refused(
                    client: openai.AsyncOpenAI = client, refusal: type[Exception] = refusal
                ) -> bool:
                    try:
                        await client.models.list()
                    except refusal:
                        return True
                    return False

                await eventually(refused, within_s=5)
        assert (await rollouts(fleet))["rollout"]["state"] == "paused"

        code, out = await run_cli("rollout", "resume", env=env)
        assert code == 0, out
        assert (await ended(fleet, first))["rollout"]["state"] == "complete"

        second = await apply(fleet, routing_policies=[{**LLAMA_DEFAULT, "slo_ttft_ms": 902}])
        code, out = await run_cli("rollout", "promote", "--everywhere", env=env)
        assert code == 0, out
        doc = await ended(fleet, second)
        assert doc["rollout"]["state"] == "complete"
        assert doc["rollout"]["reason"].startswith("promoted by"), doc["rollout"]

        third = await apply(fleet, routing_policies=[{**LLAMA_DEFAULT, "slo_ttft_ms": 903}])
        code, out = await run_cli("rollout", "abort", env=env)
        assert code == 0, out
        doc = await ended(fleet, third)
        assert doc["rollout"]["state"] == "aborted"
        assert doc["in_force"]["intent"] == second
        code, out = await run_cli("rollout", "abort", env=env)
        assert code == 1, out
        assert "rollout_not_active" in out, out

        code, out = await run_cli("rollout", "status", env=env)
        assert code == 0, out
        assert f"rollout {doc['rollout']['id']} of revision {third}" in out, out
        assert sum(load.answers[r]["ok"] for r in REGIONS) > 0
