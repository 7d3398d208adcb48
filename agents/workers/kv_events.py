"""KV-cache events: for each model whose route sets `kv_events: true`, subscribe to every
worker's ZMQ publisher (its `kv_events_port` from the snapshot) and keep the router's exact
prefix index as the engines say: what they stored, evicted and cleared.

SGLang 0.5.23 publishes each event as a msgpack map tagged by `type` (BlockStored with a run
of `block_hashes`, one a page, BlockRemoved, AllBlocksCleared). What it published before a
subscriber joined (its warm-up, among others) is never heard: a block whose parent was never
seen cannot be chained, so the engine is asked to flush its cache once it is idle, after
which every block it stores is heard from the root.

The engine names blocks by its own hashes; the index names them by a chain over the page's
token ids, the same chain the router computes for a request's tokens, from the root of the
block's `cache_salt` (a tenant's namespace; the engine's hash is the same in every one).
Each subscription maps one to the other as blocks are stored. A gap in the sequence numbers
means events were lost: the worker's part of the index is cleared and learned again (from
dispatches and events).

Tokenizers are loaded here, off the event loop, from the directory the engine reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import msgpack
import zmq
import zmq.asyncio

from agents.config import RegionConfig, WorkerSpec
from agents.engines.tokenizers import PromptTokenizer
from agents.workers.prefix import PrefixIndex, salt_root
from agents.workers.table import WorkerTable

log = logging.getLogger(__name__)
TOPIC = b"kv-events"
RECONCILE_S = 1.0
RESYNC_EVERY_S = 5.0  # between flushes asked of one engine whose events were missed
RESYNC_TIMEOUT_S = 5.0


class Indexes(Protocol):
    """The exact prefix indexes the subscriber keeps as the engines say (the router's)."""

    config: RegionConfig | None

    def event_index(self, model: str) -> tuple[PrefixIndex, int] | None:
        """The model's event-kept index and its page size, once it has one."""
        ...

    def use_events(
        self, model: str, tokenizer: PromptTokenizer, page_size: int, capacity_blocks: int
    ) -> PrefixIndex: ...


Tokenizers = Callable[[str | None, str], PromptTokenizer | None]  # (tokenizer_path, version)


@dataclass
class Subscription:
    worker: WorkerSpec
    index: PrefixIndex
    # engine block hash -> {cache_salt: index hash}: the engine names a page by its tokens,
    # the same in every namespace; the index chains each namespace from its own root
    chains: dict[int, dict[str | None, int]] = field(default_factory=dict)
    last_seq: int | None = None
    events: int = 0
    # events were missed (before this subscriber joined, or lost): blocks whose parents it
    # never saw. The engine's cache is flushed when it is idle, so that what it then stores
    # is all heard (AllBlocksCleared clears this)
    missed: bool = False
    flushed_at: float = float("-inf")  # loop time of the last flush asked for

    def apply(self, seq: int, events: list[Any]) -> None:
        worker = self.worker.id
        if self.last_seq is not None and seq != self.last_seq + 1:
            log.warning("kv events of %s: %d lost; relearning", worker, seq - self.last_seq - 1)
            self.index.clear(worker)
            self.chains.clear()
            self.missed = True
        self.last_seq = seq
        for event in events:
            self.events += 1
            kind = event.get("type") if isinstance(event, dict) else None
            if kind == "BlockStored":
                size = int(event.get("block_size") or 1)
                self._stored(event["block_hashes"], event.get("parent_block_hash"),
                             event["token_ids"], size, event.get("cache_salt"))  # fmt: skip
            elif kind == "BlockRemoved":  # in every namespace that has it (events say not which)
                gone = [c for h in event["block_hashes"] if h in self.chains
                        for c in self.chains.pop(h).values()]  # fmt: skip
                self.index.remove(worker, gone)
            elif kind == "AllBlocksCleared":
                self.index.clear(worker)
                self.chains.clear()
                self.missed = False

    def _stored(
        self, hashes: list[int], parent: int | None, ids: list[int], size: int, salt: str | None
    ) -> None:
        if parent is None:
            chain: int | None = salt_root(salt)
        else:
            chain = self.chains.get(parent, {}).get(salt)
        if chain is None:  # its parent was never seen here: nothing to chain it to
            self.missed = True
            return
        added = []
        for i, engine_hash in enumerate(hashes):
            page = ids[i * size : (i + 1) * size]
            chain = hash((chain, array("i", page).tobytes()))  # as PrefixIndex.hashes chains
            self.chains.setdefault(engine_hash, {})[salt] = chain
            added.append(chain)
        self.index.insert(self.worker.id, added)


class KvEventSubscriber:
    """`tokenizers`: an engine's tokenizer, by what it says of itself (its backend's to say:
    agents/engines/backends.py `tokenizer`)."""

    def __init__(self, router: Indexes, table: WorkerTable, tokenizers: Tokenizers) -> None:
        self.router = router
        self.table = table
        self.tokenizers = tokenizers
        self.context = zmq.asyncio.Context.instance()
        self._tasks: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._specs: dict[tuple[str, int], WorkerSpec] = {}
        self.subscriptions: dict[str, Subscription] = {}

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=RESYNC_TIMEOUT_S)
        connector = aiohttp.TCPConnector(force_close=True)  # seldom used: none kept idle
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            try:
                while True:
                    await self._reconcile()
                    await self._resync(http)
                    await asyncio.sleep(RECONCILE_S)
            finally:
                for task in self._tasks.values():
                    task.cancel()

    async def _resync(self, http: aiohttp.ClientSession) -> None:
        """Ask each engine whose events were missed to flush its cache: SGLang answers 400
        while requests run, so it is asked again until it is idle. Its AllBlocksCleared, and
        every block stored after it, are then heard whole."""
        now = asyncio.get_running_loop().time()
        for subscription in list(self.subscriptions.values()):
            if not subscription.missed or now - subscription.flushed_at < RESYNC_EVERY_S:
                continue
            subscription.flushed_at = now
            url = f"{subscription.worker.url}/flush_cache"
            try:
                async with http.post(url) as response:
                    flushed = response.status == 200
            except (aiohttp.ClientError, TimeoutError):
                flushed = False
            said = "its cache was flushed" if flushed else "it is busy: flushed later"
            log.info("kv events of %s were missed: %s", subscription.worker.id, said)

    async def _reconcile(self) -> None:
        config = self.router.config
        wanted: dict[tuple[str, int], tuple[WorkerSpec, PrefixIndex]] = {}
        if config is not None:
            for model, route in config.routes.items():
                if not route.params.kv_events:
                    continue
                index = await self._index(model, route.params.prefix_index_blocks)
                if index is None:
                    continue
                for entry in self.table.entries.values():
                    spec = entry.spec
                    key = (spec.id, id(index))
                    # Subscribe once a worker answers its polls (it has bound its publisher:
                    # a socket that connects to a port nothing listens on, in the ephemeral
                    # range, can connect to itself and take the port the engine is about to
                    # bind), and stay subscribed through a missed poll: a new socket would
                    # miss what is published while it joins.
                    held = key in self._tasks and entry.spec == self._specs.get(key)
                    if (
                        spec.model == model
                        and spec.kv_events_port is not None
                        and (entry.reachable or held)
                    ):
                        wanted[key] = (spec, index)
        for key in [k for k in self._tasks if k not in wanted]:
            self._tasks.pop(key).cancel()
            self._specs.pop(key, None)
        for key, (spec, index) in wanted.items():
            task = self._tasks.get(key)
            if task is None or task.done() or self._specs.get(key) != spec:
                if task is not None:
                    task.cancel()
                self._specs[key] = spec
                self._tasks[key] = asyncio.get_running_loop().create_task(
                    self._subscribe(spec, index)
                )

    async def _index(self, model: str, capacity_blocks: int) -> PrefixIndex | None:
        """The model's exact index, once a worker has said what tokenizer and pages it uses."""
        exact = self.router.event_index(model)
        infos = [e.info for e in self.table.entries.values() if e.spec.model == model and e.info]
        if not infos:
            return exact[0] if exact is not None else None
        info = infos[0]
        if exact is not None and exact[1] == info.page_size:
            return exact[0]
        tokenizer = await asyncio.to_thread(self.tokenizers, info.tokenizer_path, info.version)
        if tokenizer is None:
            log.warning("no tokenizer for %s at %s: matching approximately", model, info)
            return None
        return self.router.use_events(model, tokenizer, info.page_size, capacity_blocks)

    async def _subscribe(self, worker: WorkerSpec, index: PrefixIndex) -> None:
        socket = self.context.socket(zmq.SUB)
        socket.setsockopt(zmq.SUBSCRIBE, TOPIC)
        socket.setsockopt(zmq.RCVHWM, 100_000)
        socket.setsockopt(zmq.RECONNECT_IVL, 1000)  # ms; a worker gone is dropped on reconcile
        endpoint = f"tcp://{worker.host}:{worker.kv_events_port}"
        socket.connect(endpoint)
        subscription = self.subscriptions[worker.id] = Subscription(worker, index)
        log.info("subscribed to the kv events of %s at %s", worker.id, endpoint)
        try:
            while True:
                _, seq, payload = await socket.recv_multipart()
                try:
                    _, events, *_ = msgpack.unpackb(payload)
                    subscription.apply(int.from_bytes(seq, "big"), events)
                except (ValueError, TypeError, LookupError, msgpack.UnpackException) as error:
                    log.warning("a kv event of %s could not be read: %s", worker.id, error)
        finally:
            with contextlib.suppress(Exception):
                socket.close(linger=0)
            if self.subscriptions.get(worker.id) is subscription:
                del self.subscriptions[worker.id]
