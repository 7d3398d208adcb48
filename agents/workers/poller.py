"""Poll every worker of the region for its load (`/get_load`) often; what it is (`/server_info`:
its KV pool, page size, tokenizer, KV events) once. A worker that does not answer a few polls
in a row is unreachable."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import orjson

from agents.engines import metrics
from agents.workers.table import EngineInfo, EngineLoad, WorkerEntry, WorkerTable

log = logging.getLogger(__name__)
FAIL_AFTER = 2  # polls in a row without an answer
METRICS_EVERY = 2  # polls between reads of an engine's metrics (its time per token)


class LoadPoller:
    def __init__(self, table: WorkerTable, interval_s: float, timeout_s: float) -> None:
        self.table = table
        self.interval_s = interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(connector=connector, timeout=self._timeout) as http:
            while True:
                try:
                    entries = list(self.table.entries.values())
                    await asyncio.gather(*(self._poll(http, e) for e in entries))
                except Exception:  # a loop boundary: log and go on
                    log.exception("polling the workers failed")
                await asyncio.sleep(self.interval_s)

    async def _poll(self, http: aiohttp.ClientSession, entry: WorkerEntry) -> None:
        load: EngineLoad | None = None
        try:
            ranks = await _get_json(http, f"{entry.spec.url}/get_load")
            load = EngineLoad(at=self.table.clock())
            for rank in ranks:
                waiting = int(rank.get("num_waiting_reqs", 0))
                load.running += int(rank.get("num_reqs", 0)) - waiting
                load.waiting += waiting
                load.used_tokens += int(rank.get("num_tokens", 0))
                load.pending_tokens += int(rank.get("num_pending_tokens", 0))
            if entry.info is None:
                self.table.described(entry.spec.id, await _info(http, entry.spec.url))
            load.step_s = entry.load.step_s
            if entry.polls % METRICS_EVERY == 0:
                load.step_s = await _step(http, entry.spec.url) or 0.0
        except (aiohttp.ClientError, TimeoutError, ValueError, TypeError, AttributeError):
            load = None
        self.table.polled(entry.spec.id, load, FAIL_AFTER)


async def _get_json(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url) as response:
        if response.status != 200:
            raise ValueError(f"{url}: {response.status}")
        return orjson.loads(await response.read())


async def _step(http: aiohttp.ClientSession, url: str) -> float | None:
    """The engine's time per token of a running answer now; None without metrics (SGLang
    without --enable-metrics), or when they do not answer: the load poll stands without
    them."""
    try:
        async with http.get(f"{url}/metrics") as response:
            if response.status != 200:
                return None
            text = await response.text()
    except (aiohttp.ClientError, TimeoutError):
        return None
    return await asyncio.to_thread(metrics.decode_step, text)


async def _info(http: aiohttp.ClientSession, url: str) -> EngineInfo:
    info = await _get_json(http, f"{url}/server_info")
    states = info.get("internal_states") or []
    total = sum(int(s.get("max_total_num_tokens", 0)) for s in states if isinstance(s, dict))
    path = info.get("tokenizer_path") or info.get("model_path")
    return EngineInfo(
        max_total_tokens=total or int(info.get("max_total_tokens") or 0),
        page_size=max(1, int(info.get("page_size") or 1)),
        tokenizer_path=str(path) if path else None,
        version=str(info.get("version") or ""),
        kv_events=bool(info.get("kv_events_config")),
    )
