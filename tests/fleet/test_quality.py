"""The quality guard in a fleet of real processes (a control plane, an agent, three simulated
engines of one model): a worker turned to emit garbage under steady traffic is quarantined
within 60 s and 50 of its answers and readmitted once it is well; a worker with wrong
weights is caught by canaries alone with no user traffic; each event reaches the agent's
metrics, the control plane's audit log, the model's status and the status page."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from tests.kits.fleet import LLAMA, Fleet, fleet_of
from tests.kits.push import ADMIN, eventually

ASK: Any = {"role": "user", "content": "tell me about the river"}


def _three(doc: dict[str, Any]) -> None:
    for d in doc["deployments"]:
        if d["name"] == "llama-us-east":
            d["replicas"] = 3


def _garbled(text: str) -> bool:
    return any(0x2580 <= ord(c) < 0x2600 for c in text)


async def _held(fleet: Fleet) -> dict[str, str]:
    """worker: quarantined or alert, as the agent holds them now."""
    quality = (await fleet.status("us-east"))["quality"]
    return {h["worker"]: h["kind"] for h in quality["held"]}


async def _fault(url: str, change: dict[str, Any]) -> None:
    async with httpx.AsyncClient(timeout=5) as http:
        answer = await http.post(f"{url}/sim/faults", json=change)
        assert answer.status_code == 200, answer.text


class Traffic:
    """Chats two at a time until stopped; the answers that came back garbled are counted."""

    def __init__(self, client: openai.AsyncOpenAI) -> None:
        self.client, self.answers, self.garbled = client, 0, 0
        self._stop = asyncio.Event()
        self._tasks = [asyncio.ensure_future(self._loop(i)) for i in range(2)]

    async def _loop(self, lane: int) -> None:
        while not self._stop.is_set():
            if lane == 0:
                answer = await self.client.chat.completions.create(
                    model=LLAMA, messages=[ASK], max_tokens=32
                )
                text = answer.choices[0].message.content or ""
            else:
                stream = await self.client.chat.completions.create(
                    model=LLAMA, messages=[ASK], max_tokens=32, stream=True
                )
                text = "".join([c.choices[0].delta.content or "" async for c in stream
                                if c.choices])  # fmt: skip
            self.answers += 1
            self.garbled += _garbled(text)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


async def test_bad_workers_are_quarantined_readmitted_and_reported(
    database_url: str, tmp_path: Path
) -> None:
    env = {"MERIDIAN_AGENT_CANARY_EVERY_S": "1"}
    async with fleet_of(database_url, tmp_path, ("us-east",), _three, agent_env=env) as fleet:
        engines = {e["id"]: e["url"] for e in (await fleet.status("us-east"))["engines"]}
        _, second, third = sorted(engines)

        async def made() -> bool:
            canaries = (await fleet.status("us-east"))["quality"]["canaries"]
            return LLAMA in canaries["made"]

        await eventually(made, within_s=30)

        # wrong weights, no user traffic: the canaries alone catch it
        await _fault(engines[third], {"logprob_shift": 0.3})
        await eventually(lambda: _is(fleet, third, "quarantined"), within_s=30)
        await _fault(engines[third], {"logprob_shift": 0})
        await eventually(lambda: _is(fleet, third, None), within_s=30)

        # garbage under steady traffic: out within 60 s and 50 of the answers it gave
        traffic = Traffic(fleet.client("us-east"))

        async def flowing() -> bool:
            return traffic.answers >= 20

        await eventually(flowing, within_s=30)
        await _fault(engines[second], {"output": "garbage"})
        started = time.monotonic()
        await eventually(lambda: _is(fleet, second, "quarantined"), within_s=60)
        took = time.monotonic() - started
        before = traffic.garbled
        await asyncio.sleep(2)  # answers under way when it was taken out have ended
        after = traffic.garbled - before
        seen = traffic.answers
        await asyncio.sleep(3)
        clean = traffic.answers - seen
        garbled_later = traffic.garbled - before - after
        await _fault(engines[second], {"output": "none"})
        await eventually(lambda: _is(fleet, second, None), within_s=30)
        await traffic.stop()
        assert took <= 60
        assert before <= 50, f"{before} garbled answers before the quarantine"
        assert clean > 0
        assert garbled_later == 0, "answers from a quarantined worker"

        metrics = await _metrics(fleet)
        assert f'kind="quarantined",model="{LLAMA}",worker="{second}"' in metrics
        assert f'kind="readmitted",model="{LLAMA}",worker="{third}"' in metrics

        async with httpx.AsyncClient(base_url=fleet.cp.url, headers=ADMIN, timeout=10) as cp:

            async def logged() -> list[tuple[str, str]]:
                got = await cp.get("/v1/audit-events", params={"kind": "worker", "limit": 50})
                assert got.status_code == 200, got.text
                return [(e["name"], e["action"]) for e in reversed(got.json()["items"])]

            expected = [(third, "quarantined"), (third, "readmitted"),
                        (second, "quarantined"), (second, "readmitted")]  # fmt: skip
            await eventually(lambda: _equals(logged(), expected), within_s=15)
            events = (await cp.get("/v1/audit-events", params={"kind": "worker"})).json()
            garbage = next(e for e in events["items"]
                           if (e["name"], e["action"]) == (second, "quarantined"))  # fmt: skip
            evidence = garbage["after"]
            assert evidence["model"] == LLAMA
            assert evidence["check"]  # a detector, or canary:<name>
            assert garbage["principal"] == "node:us-east-1"

            async def rolled_up() -> dict[str, Any] | None:
                """The model's view and the status page both show the region's answers (each
                is built from the heartbeats as they come: one may show them before the
                other)."""
                model = (await cp.get(f"/v1/models/{LLAMA}")).json()
                regions = ((model.get("status") or {}).get("quality") or {}).get("regions", {})
                page: dict[str, Any] = (await cp.get("/v1/status")).json()
                shown = page["quality"]["models"].get(LLAMA, {}).get("regions", {})
                ok = regions.get("us-east", {}).get("answers", 0) > 0
                return page if ok and shown.get("us-east", {}).get("answers", 0) > 0 else None

            page = await eventually(rolled_up, within_s=20)
            assert {e["worker"] for e in page["quality"]["events"]} == {second, third}


async def _is(fleet: Fleet, worker: str, kind: str | None) -> bool:
    return (await _held(fleet)).get(worker) == kind


async def _equals(got: Any, expected: Any) -> bool:
    return bool(await got == expected)


async def _metrics(fleet: Fleet) -> str:
    agent = fleet.agents["us-east"]
    async with httpx.AsyncClient(timeout=5) as http:
        answer = await http.get(f"{agent.url}/metrics",
                                headers={"Authorization": f"Bearer {agent.operator}"})  # fmt: skip
        assert answer.status_code == 200, answer.text
        return answer.text
