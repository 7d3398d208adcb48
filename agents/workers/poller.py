"""The one observer of every engine's load: each worker of the region, and each engine this
node runs (those draining out of the table too), is polled for `/v1/loads` often, by a loop
of its own, so an engine that hangs delays no other's reading. What a worker is
(`/server_info`: its KV pool, page size, tokenizer, KV events) is asked once. A worker that
does not answer a few polls in a row is unreachable.

`/v1/loads` carries what the router needs of an engine in one answer: its running and
waiting requests, its uncached prompt tokens waiting for prefill, its KV pool and what is
used of it, and its generation throughput (so its decode step: no metrics scrape). An
engine started with LoRA is asked its adapters too (`/v1/models`), every few polls and
whenever it answers again after a silence. It is
asked of SGLang's scheduler, so an engine whose scheduler is wedged stops answering it: the
engine's runner reads that here (`seen`) rather than asking again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

import aiohttp
import orjson

from agents.engines import contract, metrics
from agents.engines.contract import SILENT_AFTER, Seen
from agents.workers.table import EngineLoad, WorkerTable

log = logging.getLogger(__name__)
FAIL_AFTER = SILENT_AFTER  # polls in a row without an answer: unreachable
MODELS_EVERY = 5  # polls: how often an engine with LoRA is asked its adapters

Engines = Callable[[], Iterable[tuple[str, str]]]  # (engine id, url) of this node's engines


class LoadPoller:
    def __init__(
        self,
        table: WorkerTable,
        interval_s: float,
        timeout_s: float,
        local: Engines = tuple,
    ) -> None:
        self.table = table
        self.interval_s = interval_s
        self.local = local
        self.seen: dict[str, Seen] = {}  # by engine id: its last reading, failures in a row
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._loops: dict[str, tuple[str, asyncio.Task[None]]] = {}  # by id: (url, its loop)
        self._http: aiohttp.ClientSession | None = None  # while it runs
        self._models_at: dict[str, int] = {}  # by id: polls since its adapters were asked

    def observed(self, engine_id: str) -> Seen | None:
        return self.seen.get(engine_id)

    def targets(self) -> dict[str, str]:
        """What is polled: engine id to its URL."""
        wanted = {e.spec.id: e.spec.url for e in self.table.entries.values()}
        wanted.update(self.local())
        return wanted

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(connector=connector, timeout=self._timeout) as http:
            self._http = http
            try:
                while True:
                    try:
                        self._follow(http, self.targets())
                    except Exception:  # a loop boundary: log and go on
                        log.exception("following the workers to poll failed")
                    await asyncio.sleep(self.interval_s)
            finally:
                for _, task in self._loops.values():
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.gather(*(t for _, t in self._loops.values()))
                self._loops.clear()
                self._http = None

    async def counters(self, engines: Iterable[tuple[str, str]]) -> dict[str, metrics.Counters]:
        """The engines' own counters (`/metrics`), by engine id, for a heartbeat: those that
        answer (an engine started without `--enable-metrics` answers 404)."""
        http = self._http
        if http is None:
            return {}
        engines = list(engines)
        texts = await asyncio.gather(
            *(_get_text(http, url + contract.METRICS) for _, url in engines)
        )
        found = {e: t for (e, _), t in zip(engines, texts, strict=True) if t is not None}
        return await asyncio.to_thread(lambda: {e: metrics.parse(t) for e, t in found.items()})

    def _follow(self, http: aiohttp.ClientSession, wanted: dict[str, str]) -> None:
        """A loop for every engine wanted, none for the rest."""
        for engine_id, (url, task) in list(self._loops.items()):
            if wanted.get(engine_id) != url or task.done():
                task.cancel()
                del self._loops[engine_id]
                self.seen.pop(engine_id, None)
                self._models_at.pop(engine_id, None)
        loop = asyncio.get_running_loop()
        for engine_id, url in wanted.items():
            if engine_id not in self._loops:
                task = loop.create_task(self._watch(http, engine_id, url), name=f"poll {url}")
                self._loops[engine_id] = (url, task)

    async def _watch(self, http: aiohttp.ClientSession, engine_id: str, url: str) -> None:
        while True:
            try:
                await self._poll(http, engine_id, url)
            except Exception:  # a loop boundary: log and go on
                log.exception("polling %s failed", url)
            await asyncio.sleep(self.interval_s)

    async def _poll(self, http: aiohttp.ClientSession, engine_id: str, url: str) -> None:
        reading: contract.LoadReading | None = None
        try:
            reading = contract.read_loads(await _get_json(http, url + contract.LOADS))
            entry = self.table.get(engine_id)
            if entry is not None and entry.info is None:
                info = await _get_json(http, url + contract.SERVER_INFO)
                self.table.described(engine_id, contract.read_server_info(info))
            lora = entry is not None and entry.info is not None and entry.info.lora
            if lora and self._adapters_due(engine_id):
                # its adapters (the tokenizer manager answers: no scheduler's time)
                models = await _get_json(http, url + contract.MODELS)
                self.table.holds(engine_id, contract.read_adapters(models))
                self._models_at[engine_id] = 0
        except (aiohttp.ClientError, TimeoutError, ValueError, TypeError, AttributeError):
            reading = None
        before = self.seen.get(engine_id)
        if reading is None:
            failed = before.failed + 1 if before is not None else 1
            self.seen[engine_id] = Seen(before.reading if before else None, failed)
            self.table.polled(engine_id, None, FAIL_AFTER)
            return
        self.seen[engine_id] = Seen(reading, 0)
        self.table.polled(
            engine_id,
            EngineLoad(
                running=reading.running,
                waiting=reading.waiting,
                used_tokens=reading.used_tokens,
                pending_tokens=reading.pending_tokens,
                max_total_tokens=reading.max_total_tokens,
                step_s=reading.step_s,
                at=self.table.clock(),
                max_running=reading.max_running,
            ),
            FAIL_AFTER,
        )

    def _adapters_due(self, engine_id: str) -> bool:
        """Whether to ask the engine its adapters at this poll: every MODELS_EVERY polls
        (the keeper writes its own loads in the table at once, so only what the engine did
        itself shows late: an eviction), and at once when it answers after polls it did not
        (it may have restarted, holding none). A list of hundreds at every poll of every
        engine took a third of the agent's loop."""
        before = self.seen.get(engine_id)
        since = self._models_at.get(engine_id, MODELS_EVERY) + 1
        self._models_at[engine_id] = since
        return since >= MODELS_EVERY or before is None or before.failed > 0


async def _get_json(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url) as response:
        if response.status != 200:
            raise ValueError(f"{url}: {response.status}")
        return orjson.loads(await response.read())


async def _get_text(http: aiohttp.ClientSession, url: str) -> str | None:
    try:
        async with http.get(url) as response:
            return await response.text() if response.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
        return None
