"""Poll every worker of the region for its load (`/v1/loads`) often; what it is
(`/server_info`: its KV pool, page size, tokenizer, KV events) once. A worker that does not
answer a few polls in a row is unreachable.

`/v1/loads` carries what the router needs of an engine in one answer: its running and
waiting requests, its uncached prompt tokens waiting for prefill, its KV pool and what is
used of it, and its generation throughput (so its decode step: no metrics scrape)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import orjson

from agents.engines import contract
from agents.workers.table import EngineLoad, WorkerEntry, WorkerTable

log = logging.getLogger(__name__)
FAIL_AFTER = 2  # polls in a row without an answer


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
            reading = contract.read_loads(await _get_json(http, entry.spec.url + contract.LOADS))
            if entry.info is None:
                info = await _get_json(http, entry.spec.url + contract.SERVER_INFO)
                self.table.described(entry.spec.id, contract.read_server_info(info))
            load = EngineLoad(
                running=reading.running,
                waiting=reading.waiting,
                used_tokens=reading.used_tokens,
                pending_tokens=reading.pending_tokens,
                max_total_tokens=reading.max_total_tokens,
                step_s=reading.step_s,
                at=self.table.clock(),
            )
        except (aiohttp.ClientError, TimeoutError, ValueError, TypeError, AttributeError):
            load = None
        self.table.polled(entry.spec.id, load, FAIL_AFTER)


async def _get_json(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url) as response:
        if response.status != 200:
            raise ValueError(f"{url}: {response.status}")
        return orjson.loads(await response.read())
