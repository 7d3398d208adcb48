"""A tenant's line of a class bounded by its own wait, at the gateway over a real simulated
engine: what the line could not take within its bound is refused as it arrives, while what
is in the line waits its turn and is served."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import httpx
from meridian_pb.fleet.v1.classes import ServiceClass, policy_for

from agents.router.classes import FRONT
from tests.agents.gateway.test_classes import _beta_may_ask_interactive, _running, _until
from tests.kits.inproc import MODEL, OTHER, OTHER_KEY, local_gateway
from tests.kits.sim import running_sim

PAST = 6  # batch requests sent past a full line


async def test_batch_past_what_its_line_can_take_is_refused_at_once() -> None:
    """One engine runs one request at a time and is busy with a long answer, until its
    client goes. A tenant's FRONT batch requests wait in its line (bound 60 s), nothing of
    it admitted yet. Six more are refused 429 `overloaded` with Retry-After 60 while the
    long answer still runs, and none of them joins the line. When the engine is free, the
    line is served, every request of it."""
    async with AsyncExitStack() as stack:
        sim = await stack.enter_async_context(
            running_sim("--max-running-requests", "1", "--slow-factor", "20", model=MODEL)
        )
        # batch starts only on an idle engine: 5 ms of slack, less than any prediction
        classes = policy_for({"batch": {"max_wait_s": 60, "slack": 0.01}})
        config = _beta_may_ask_interactive(sim.url, classes, slo_s=0.5)
        region = await stack.enter_async_context(local_gateway(config))
        admission = region.gateway.router.admission
        async with httpx.AsyncClient(base_url=region.url, timeout=120) as client:

            async def ask(service_class: str, max_tokens: int, **extra: bool) -> httpx.Response:
                return await client.post(
                    "/v1/chat/completions",
                    json={"model": MODEL, "max_tokens": max_tokens, **extra,
                          "messages": [{"role": "user", "content": "hi"}]},
                    headers={"Authorization": f"Bearer {OTHER_KEY}",
                             "x-meridian-class": service_class},
                )  # fmt: skip

            def line() -> int:
                state = admission.classes.models.get(MODEL)
                lines = state.lines if state is not None else {}
                return len(lines.get((ServiceClass.BATCH, OTHER.name), {}))

            long = asyncio.create_task(ask("standard", 2000, stream=True))  # let go below
            await _until(lambda: _running(region) == 1)
            waiting = [asyncio.create_task(ask("batch", 2)) for _ in range(FRONT)]
            await _until(lambda: line() == FRONT)
            past = await asyncio.gather(*(ask("batch", 2) for _ in range(PAST)))
            assert not long.done()  # answered while the engine was still busy
            assert line() == FRONT  # none of them joined it
            assert region.gateway.books.rejections[MODEL, "overloaded"] == PAST
            long.cancel()  # its client goes: the engine is free
            served = await asyncio.gather(*waiting)
        for refused in past:
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "overloaded"
            assert refused.headers["Retry-After"] == "60"
        assert [a.status_code for a in served] == [200] * FRONT, [a.text for a in served]
        assert region.idle()
