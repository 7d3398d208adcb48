"""The load poller, the one observer of engines' load, against simulators as real child
processes: one engine that hangs delays no other's reading, and the engines this node runs are
watched whether or not the snapshot routes to them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx

from agents.config import WorkerSpec
from agents.workers.poller import FAIL_AFTER, LoadPoller
from agents.workers.table import WorkerTable
from tests.kits.sim import running_sim


def _worker(worker_id: str, url: str) -> WorkerSpec:
    return WorkerSpec(worker_id, "llama", "d", "unified", url, node=None)


async def _until(check: Callable[[], bool], within_s: float = 20) -> None:
    async with asyncio.timeout(within_s):
        while not check():  # noqa: ASYNC110 - the poller's loops change it; no event to share
            await asyncio.sleep(0.05)


async def test_a_hung_engine_delays_no_other_engines_reading() -> None:
    async with running_sim() as hung, running_sim() as well:
        await hung.healthy()
        await well.healthy()
        table = WorkerTable()
        table.replace([_worker("hung", hung.url), _worker("well", well.url)])
        poller = LoadPoller(table, interval_s=0.05, timeout_s=1.0)
        task = asyncio.create_task(poller.run())
        try:
            await _until(lambda: all(e.reachable for e in table.entries.values()))
            async with httpx.AsyncClient() as client:
                await client.post(f"{hung.url}/sim/faults", json={"hang": True})
            start = table.entries["well"].polls
            await asyncio.sleep(0.7)  # less than one poll's timeout at the hung engine
            # polled at its own pace: a dozen answers, where rounds that wait for every
            # engine would have seen one at most within the hung one's 1 s timeout
            assert table.entries["well"].polls - start >= 5
            await _until(lambda: not table.entries["hung"].reachable)
            seen = poller.observed("hung")
            assert seen is not None
            assert seen.silent
            assert seen.failed >= FAIL_AFTER
            assert table.entries["well"].reachable
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            async with httpx.AsyncClient() as client:  # so that it stops at once
                await client.post(f"{hung.url}/sim/faults", json={"hang": False})


async def test_this_nodes_engines_are_watched_outside_the_table_and_forgotten_when_gone() -> None:
    """A draining engine has left the snapshot's workers; its drain still reads its load."""
    async with running_sim() as engine:
        await engine.healthy()
        local = [("d/unified-0", engine.url)]
        poller = LoadPoller(WorkerTable(), interval_s=0.05, timeout_s=3.0, local=lambda: local)
        task = asyncio.create_task(poller.run())
        try:
            await _until(lambda: poller.observed("d/unified-0") is not None)
            body = {"text": "count", "sampling_params": {"max_new_tokens": 400}}
            async with httpx.AsyncClient(timeout=60) as client:
                call = asyncio.create_task(client.post(f"{engine.url}/generate", json=body))

                def running() -> bool:
                    seen = poller.observed("d/unified-0")
                    return (
                        seen is not None
                        and seen.reading is not None
                        and (seen.reading.running == 1)
                    )

                await _until(running)
                call.cancel()
            local.clear()
            await _until(lambda: poller.observed("d/unified-0") is None)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
