"""Which LoRA adapters the region's engines hold, and loading them (issue 45).

The engines are the truth: the load poller reads each one's adapters (`/v1/models`) into the
worker table, and a load here writes it at once. The router ranks by that (held, room to load
one, neither); the gateway calls `ensure` before it sends an adapter's request to an engine
that does not hold it (a cold load, counted and timed), so no request reaches an engine that
would answer "never loaded".

For this node's own engines the keeper also keeps what each should hold: what the leader
plans (an adapter on `resident` engines of its base model, the same ones whichever agent
chooses: by a hash of adapter and engine, among those with LoRA and room: `placement`), and
what it held while ready. An engine that restarts comes back with none and takes no request for
them until they are loaded again (it does, at once); an adapter's new version replaces the
old one where it is held; an adapter gone from the snapshot is unloaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import aiohttp
import orjson
from meridian_pb.fleet.v1 import fleet_pb2 as pb
from meridian_pb.fleet.v1.adapters import planned_slots

from agents.adapter_config import AdapterConfig
from agents.adapters.files import AdapterFiles, AdapterUnavailable
from agents.engines import contract
from agents.workers.table import READY, WorkerEntry, WorkerTable

log = logging.getLogger(__name__)
TIDY_S = 1.0  # how often this node's engines are brought to what they should hold
COLD_LOAD_S = 1.0  # a cold load's time, predicted, until one has been measured
LOAD_TIMEOUT_S = 120.0
RETRY_FAILED_S = 30.0  # a load the engine refused is not tried again sooner in the background
JSON = {"Content-Type": "application/json"}


class EngineUnreachable(AdapterUnavailable):
    """The engine did not answer: it is down or restarting, which says nothing of the
    adapter; the next tidy tries again."""


@dataclass
class AdapterCounts:
    requests: int = 0
    cold_loads: int = 0  # loads a request waited for
    cold_load_s: float = 0.0  # their time, summed
    loads: int = 0  # every load here: cold ones, and those after a restart or a new version
    failures: int = 0
    last_error: str = ""


class AdapterKeeper:
    def __init__(
        self,
        table: WorkerTable,
        files: AdapterFiles,
        local: Callable[[], Iterable[str]] = tuple,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`local`: the ids of the engines this node runs."""
        self.table, self.files, self.local, self.clock = table, files, local, clock
        self.adapters: Mapping[str, AdapterConfig] = {}
        self.counts: dict[str, AdapterCounts] = {}
        self.should: dict[str, set[str]] = {}  # this node's engines: adapters to hold
        self._loads: dict[tuple[str, str, str], asyncio.Task[None]] = {}
        self._http: aiohttp.ClientSession | None = None
        self._wake = asyncio.Event()
        self._measured: float | None = None  # a cold load's time, averaged
        self._tidy_files = False  # versions no longer in force are to go from the cache
        self._started = clock()
        self._failed_at: dict[tuple[str, str, str], float] = {}  # a load's last failure
        self._placed: tuple[object, dict[str, list[str]]] | None = None  # placement()'s
        self._places: dict[str, str] = {}  # each adapter's place, as a string
        self._told: dict[str, tuple[int, float]] = {}  # requests at the last heartbeat, when

    def configure(self, adapters: Mapping[str, AdapterConfig]) -> None:
        self.adapters = adapters
        self._places = {name: str(self.files.place(a)) for name, a in adapters.items()}
        for name in adapters:
            self.counts.setdefault(name, AdapterCounts())
        self._tidy_files = True
        self._wake.set()

    def cold_load_s(self) -> float:
        """A cold load's time as predicted: what they took here lately."""
        return self._measured if self._measured is not None else COLD_LOAD_S

    def engine_state(self, engine_id: str, state: str) -> None:
        if state == READY:
            self._wake.set()

    def used(self, adapter: str) -> None:
        counts = self.counts.get(adapter)
        if counts is not None:
            counts.requests += 1

    async def ensure(self, entry: WorkerEntry, adapter: AdapterConfig, cold: bool = True) -> None:
        """The worker holds this version of the adapter once this returns (one load at a
        time per worker and version, whoever waits for it); AdapterUnavailable if it could
        not be loaded."""
        if entry.info is not None and not entry.info.lora:
            return  # started without LoRA: nothing to load there (its answer says so)
        place = str(self.files.place(adapter))
        if entry.adapters.get(adapter.name) == place:
            return
        key = (entry.spec.id, adapter.name, place)
        task = self._loads.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._load(entry, adapter, cold))
            self._loads[key] = task
            task.add_done_callback(lambda _: self._loads.pop(key, None))
        await asyncio.shield(task)

    async def _load(self, entry: WorkerEntry, adapter: AdapterConfig, cold: bool) -> None:
        counts = self.counts.setdefault(adapter.name, AdapterCounts())
        started = self.clock()
        try:
            path = str(await self.files.fetch(adapter))
            held = entry.adapters.get(adapter.name)
            if held is not None and held != path:  # an older version: replaced
                await self._call(entry, contract.UNLOAD_LORA, {"lora_name": adapter.name})
            load = {"lora_name": adapter.name, "lora_path": path, "pinned": False}
            loaded = await self._call(entry, contract.LOAD_LORA, load)
        except AdapterUnavailable as error:
            if not isinstance(error, EngineUnreachable):  # one down is tried again at once
                key = (entry.spec.id, adapter.name, str(self.files.place(adapter)))
                self._failed_at[key] = self.clock()
            counts.failures += 1
            counts.last_error = error.message
            log.warning("%s", error.message)
            raise
        elapsed = self.clock() - started
        counts.loads += loaded
        if cold and loaded:  # (one the engine held already, as it had not yet said: none)
            counts.cold_loads += 1
            counts.cold_load_s += elapsed
            last = self._measured
            self._measured = elapsed if last is None else 0.8 * last + 0.2 * elapsed
        self.table.holds(entry.spec.id, {**entry.adapters, adapter.name: path})

    async def _call(self, entry: WorkerEntry, path: str, body: dict[str, object]) -> bool:
        """Whether the engine did it (False: it held the adapter already, or did not)."""
        http = self._session()
        name = body["lora_name"]
        try:
            url, sent = entry.spec.url + path, orjson.dumps(body)
            async with http.post(url, data=sent, headers=JSON) as answer:
                text = await answer.text()
        except (aiohttp.ClientError, TimeoutError) as error:
            raise EngineUnreachable(
                f"adapter {name}: {entry.spec.id} did not answer {path}: {error!r}"
            ) from error
        if answer.status == 200:
            return True
        if path == contract.LOAD_LORA and contract.ALREADY_LOADED in text:
            return False
        if path == contract.UNLOAD_LORA and answer.status == 400:
            return False  # not held (evicted, or the engine restarted): as good as unloaded
        raise AdapterUnavailable(
            f"adapter {name}: {entry.spec.id} answered {path} with {answer.status}: {text[:300]}"
        )

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            timeout = aiohttp.ClientTimeout(total=LOAD_TIMEOUT_S)
            self._http = aiohttp.ClientSession(timeout=timeout)
        return self._http

    async def run(self) -> None:
        """Brings this node's engines to what they should hold, at once on a change (an
        engine ready, a snapshot) and every TIDY_S."""
        try:
            while True:
                self._wake.clear()
                await self.tidy()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), TIDY_S)
        finally:
            if self._http is not None:
                await self._http.close()

    def planned(self, adapter: AdapterConfig) -> list[str]:
        """The engines of the region that keep the adapter loaded, by the leader's plan."""
        return self.placement().get(adapter.name, [])

    def placement(self) -> dict[str, list[str]]:
        """The leader's plan placed on engines, the same by every agent of the region: the
        adapters taken in order (the widest plan first, then by name), each on the first
        engines of its base model by a hash of adapter and engine that have room left
        (`planned_slots` of what each holds, as the leader sized the plan, so that a request
        for another adapter loads it without unloading a planned one). Worked out again when
        the adapters or the engines change."""
        able = sorted(
            (e.spec.id, e.spec.model, e.info.max_loaded_loras)
            for e in self.table.entries.values()
            if e.info is not None and e.info.lora
        )  # fmt: skip
        key = (id(self.adapters), tuple(able))
        if self._placed is not None and self._placed[0] == key:
            return self._placed[1]
        room = {e: (planned_slots(most) if most else None) for e, _, most in able}
        out: dict[str, list[str]] = {}
        for adapter in sorted(self.adapters.values(), key=lambda a: (-a.resident, a.name)):
            if adapter.resident <= 0:
                continue
            engines = sorted((e for e, model, _ in able if model == adapter.base_model),
                             key=lambda e: _rank(adapter.name, e), reverse=True)  # fmt: skip
            chosen: list[str] = []
            for e in engines:
                left = room[e]
                if len(chosen) < adapter.resident and (left is None or left > 0):
                    chosen.append(e)
                    room[e] = None if left is None else left - 1
            out[adapter.name] = chosen
        self._placed = (key, out)
        return out

    async def tidy(self) -> None:
        """Each ready engine here brought to what it should hold: what the plan puts on it,
        and what it held (before a restart: what it held then)."""
        jobs = []
        local = set(self.local())
        planned: dict[str, set[str]] = {}
        for name, engines in self.placement().items():
            for engine_id in engines:
                planned.setdefault(engine_id, set()).add(name)
        for engine_id in local:
            entry = self.table.get(engine_id)
            if entry is None or entry.engine_state != READY or entry.info is None:
                continue
            if not entry.info.lora:
                continue
            if entry.adapters:  # what it holds now; else what it held before its restart
                self.should[engine_id] = set(entry.adapters)
            should = self.should.setdefault(engine_id, set())
            should.intersection_update(self.adapters)
            wanted = should | planned.get(engine_id, set())
            # only what it lacks (a task for each of a thousand held would take the loop for
            # tens of milliseconds a second); the busiest first: the engine loads one at a
            # time, and their requests wait
            lacks = [n for n in wanted if entry.adapters.get(n) != self._place(n)]
            for name in sorted(lacks, key=lambda n: (-self._requests(n), n)):
                failed = self._failed_at.get((engine_id, name, self._place(name)))
                if failed is None or self.clock() - failed >= RETRY_FAILED_S:
                    jobs.append(self.ensure(entry, self.adapters[name], cold=False))
            for name in sorted(n for n in entry.adapters if n not in self.adapters):
                jobs.append(self._unload(entry, name))
        results = await asyncio.gather(*jobs, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, AdapterUnavailable):
                log.error("keeping adapters failed: %r", result)
        if self._tidy_files:
            self._tidy_files = False
            await asyncio.to_thread(self.files.forget, set(self._places.values()))

    async def _unload(self, entry: WorkerEntry, name: str) -> None:
        await self._call(entry, contract.UNLOAD_LORA, {"lora_name": name})
        self.table.holds(entry.spec.id, {n: p for n, p in entry.adapters.items() if n != name})

    def seen(self) -> list[pb.AdapterSeen]:
        """A heartbeat's: per adapter, this node's engines holding it, its requests here (a
        second since the last heartbeat, and in all) and its loads."""
        now, holding = self.clock(), self._holding(self.local())
        out = []
        for name in sorted(self.adapters):
            counts = self.counts.get(name, AdapterCounts())
            before, at = self._told.get(name, (0, self._started))
            rate = (counts.requests - before) / (now - at) if now > at else 0.0
            self._told[name] = (counts.requests, now)
            out.append(pb.AdapterSeen(
                name=name, engines=sorted(holding.get(name, ())), requests_per_second=rate,
                requests=counts.requests,
                cold_loads=counts.cold_loads, cold_load_s=counts.cold_load_s,
                failures=counts.failures,
            ))  # fmt: skip
        return out

    def _place(self, name: str) -> str:
        """Where the adapter's version in force is kept: the path an engine holding it
        loaded it from."""
        return self._places[name]

    def _requests(self, name: str) -> int:
        counts = self.counts.get(name)
        return counts.requests if counts is not None else 0

    def _holding(self, engines: Iterable[str]) -> dict[str, list[str]]:
        """Per adapter, which of `engines` hold it."""
        holding: dict[str, list[str]] = {}
        for engine_id in engines:
            entry = self.table.get(engine_id)
            for name in entry.adapters if entry is not None else ():
                holding.setdefault(name, []).append(engine_id)
        return holding

    def status(self) -> dict[str, dict[str, object]]:
        """Per adapter: the engines holding it, those the plan keeps it on, and its counts."""
        holding, placed = self._holding(self.table.entries), self.placement()
        return {
            name: {
                "base_model": adapter.base_model,
                "engines": sorted(holding.get(name, [])),
                "planned": placed.get(name, []),  # the leader's: those that keep it loaded
                **vars(self.counts.get(name, AdapterCounts())),
            }
            for name, adapter in sorted(self.adapters.items())
        }


@functools.lru_cache(maxsize=1 << 16)
def _rank(adapter: str, engine: str) -> bytes:
    """Rendezvous hashing: every agent ranks the engines alike, and an engine that comes or
    goes moves only the adapters it ranked first for."""
    return hashlib.blake2b(f"{adapter}\0{engine}".encode(), digest_size=8).digest()
