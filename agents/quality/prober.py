"""Active canaries: every `every_s`, each model's workers scored on one of its golden prompts
(agents/quality/canary.py), on SGLang's `/generate`, off the request path.

- **Only on idle capacity.** A worker gets a canary only when nothing waits for it: no request
  of this gateway's still waiting for its first byte, and none waiting in the engine at its
  last load poll; the canary waits up to `ROOM_WAIT_S` for such a moment, or is held back.
  It generates nothing (`max_new_tokens` 0): one short prefill. Quarantined workers get
  them too; that is how they are readmitted. A worker that just failed one gets the next
  after `CONFIRM_S`, not a period later.
- **Golden prompts.** A model's canaries are made once, at the first tick that finds its
  workers serving: each is asked to continue the built-in prompts greedily, and the
  continuation that more than half of them give is the reference, with their median score
  as the score the canary was made with. A prompt with no majority is tried again at the
  next tick. A lone worker makes its own: nothing here can judge it, but the control plane
  compares its scores and reference with the same model's in other regions. The canaries
  are kept in the agent's data directory, so that a worker that goes wrong later is judged
  against what its model said when it was made, not only against its peers of the day. New
  weights for the model (its `source`) make them anew.
- **Unified workers only.** A prefill or decode worker answers only as half of a PD pair; a
  request sent to one alone would wait for the other half. PD workers are judged by the
  detectors on their users' answers.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict
from itertools import count
from typing import Any, Protocol

import aiohttp
import orjson
from meridian_pb.fleet.v1.judging import judge

from agents.quality.canary import Canary, CanaryUnreadable, score
from agents.quality.runtime import Quality
from agents.router.router import Router
from agents.workers.table import NOT_SERVING, WorkerEntry

log = logging.getLogger(__name__)
IDLE_S = 3.0  # a connection idle this long is closed here, before the engine drops it
Http = aiohttp.ClientSession
EVERY_S = 5.0
TIMEOUT_S = 5.0
REFERENCE_TOKENS = 16
CONFIRM_S = 1.0  # after a failed canary, the next round comes this soon
ROOM_WAIT_S = 2.0  # how long a canary waits for its worker to have room
ROOM_POLL_S = 0.02
ROOM_KV = 0.9  # a worker whose KV pool is fuller than this has no room for a canary
GOLDEN: tuple[tuple[str, str], ...] = (
    ("river", "The old man walked slowly down to the river, and there he"),
    ("count", "Counting in English: one, two, three, four,"),
    ("recipe", "To make a simple bread you need flour, water, salt and"),
)


class Prober:
    def __init__(
        self,
        router: Router,
        quality: Quality,
        canaries: Mapping[str, list[Canary]] | None = None,
        save: Callable[[dict[str, list[Canary]]], None] | None = None,
        *,
        every_s: float = EVERY_S,
        timeout_s: float = TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.router = router
        self.table = router.table
        self.quality = quality
        self.canaries: dict[str, list[Canary]] = dict(canaries or {})
        self._save = save
        self._saving = asyncio.Lock()  # one save at a time, each of all the canaries made
        self.every_s = every_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.clock = clock
        self._turn: Counter[str] = Counter()  # model: canaries run, to take them in turn
        self._ids = count()
        self.sent: Counter[str] = Counter()  # worker: canaries sent
        self.skipped: Counter[str] = Counter()  # worker: canaries held back, no room
        # told each canary's call on its worker and the tokens it took (the ledger's meter:
        # no tenant pays)
        self.meter: Owned | None = None
        self._suspects: set[str] = set()  # workers that failed the last canary, in rotation

    def status(self) -> dict[str, Any]:
        return {
            "every_s": self.every_s,
            "made": {m: [c.name for c in made] for m, made in sorted(self.canaries.items())},
            "sent": dict(self.sent),
            "held_back": dict(self.skipped),
        }

    async def run(self) -> None:
        # uvicorn (SGLang's server) drops a connection idle for 5 s, and a canary comes every
        # few seconds: one reused as it is dropped fails; keep none idle that long
        connector = aiohttp.TCPConnector(keepalive_timeout=IDLE_S)
        async with aiohttp.ClientSession(connector=connector, timeout=self._timeout) as http:
            while True:
                # a worker that just failed one is asked again at once, not a period later
                await asyncio.sleep(min(CONFIRM_S, self.every_s) if self._suspects
                                    else self.every_s)  # fmt: skip
                try:
                    await self.tick(http)
                except Exception:  # a loop boundary: log and go on
                    log.exception("canaries failed")

    async def tick(self, http: Http) -> None:
        by_model: dict[str, list[WorkerEntry]] = {}
        for entry in self.table.entries.values():
            # a PD worker answers only as half of a pair: a request sent to it alone waits
            # for the other half (and holds a draining engine) until it times out
            if entry.spec.role != "unified":
                continue
            if entry.reachable and entry.engine_state not in NOT_SERVING:
                by_model.setdefault(entry.spec.model, []).append(entry)  # quarantined too
        await asyncio.gather(*(self._model(http, m, e) for m, e in by_model.items()))

    def has_room(self, entry: WorkerEntry) -> bool:
        """Nothing waits for the worker: a canary takes no slot a user request needs."""
        view = self.router.views.get(entry.spec.id)
        if view is not None and view.unstarted:
            return False
        return entry.load.waiting == 0 and entry.load.kv_usage < ROOM_KV

    async def _room(self, entry: WorkerEntry) -> bool:
        """Whether the worker has room within `ROOM_WAIT_S`: a busy worker is idle between
        its requests often enough."""
        deadline = self.clock() + min(ROOM_WAIT_S, self.every_s / 2)
        while not self.has_room(entry):
            if self.clock() >= deadline:
                return False
            await asyncio.sleep(ROOM_POLL_S)
        return True

    async def _model(self, http: Http, model: str, entries: list[WorkerEntry]) -> None:
        canaries = self.canaries.get(model)
        source = self._source(model)
        if canaries is not None and canaries[0].source != source:
            log.warning("the weights of %s are now %r: its canaries are made again", model,
                        source)  # fmt: skip
            canaries = None
        if canaries is None:
            await self._make(http, model, [e for e in entries if not e.quarantined], source)
            return
        canary = canaries[self._turn[model] % len(canaries)]
        self._turn[model] += 1
        scores = await self._scores(http, canary, entries)
        verdicts = judge(scores, canary.expected, self.quality.unreliable())
        self.quality.canary(model, canary, list(verdicts.values()))
        for entry in entries:
            verdict = verdicts.get(entry.spec.id)
            if verdict is not None and not verdict.passed and not entry.quarantined:
                self._suspects.add(entry.spec.id)
            else:
                self._suspects.discard(entry.spec.id)

    async def _scores(
        self, http: Http, canary: Canary, entries: list[WorkerEntry]
    ) -> dict[str, float]:
        async def one(entry: WorkerEntry) -> tuple[str, float | None]:
            if not await self._room(entry):
                self.skipped[entry.spec.id] += 1
                return entry.spec.id, None
            self.sent[entry.spec.id] += 1
            rid = f"meridian-canary-{canary.name}-{next(self._ids)}"
            text = f"{canary.prompt}{canary.reference}".encode()
            ticket = self.router.probe(entry.spec.id, text)  # in flight, as any request
            try:
                with self._owning(entry.spec.id) as spent:
                    answer = await _post(http, entry.spec.url, canary.body(rid))
                    spent(answer)
                return entry.spec.id, score(answer)
            except (aiohttp.ClientError, TimeoutError, ValueError, CanaryUnreadable) as error:
                log.info("canary %s on %s: no score: %s", canary.name, entry.spec.id, error)
                return entry.spec.id, None
            finally:  # ended either way; a canary's failure is the guard's to judge, not the
                # breaker's
                if ticket is not None:
                    self.router.abandoned(ticket)
                    self.router.admission.notify(entry.spec.model)

        got = await asyncio.gather(*(one(e) for e in entries))
        return {worker: s for worker, s in got if s is not None}

    @contextmanager
    def _owning(self, worker: str) -> Iterator[Callable[[bytes], None]]:
        if self.meter is None:
            yield lambda _: None
            return
        with self.meter.owning(worker) as spent:

            def told(answer: bytes) -> None:
                try:
                    meta = orjson.loads(answer)["meta_info"]
                    spent(int(meta["prompt_tokens"]), int(meta["completion_tokens"]))
                except (ValueError, KeyError, TypeError):
                    return  # no usage said: the meter counts it as the engine does

            yield told

    def _source(self, model: str) -> str:
        config = self.router.config
        known = config.models.get(model) if config is not None else None
        return known.source if known is not None else ""

    async def _make(self, http: Http, model: str, entries: list[WorkerEntry], source: str) -> None:
        if not entries:
            return
        made = []
        for name, prompt in GOLDEN:
            texts = await asyncio.gather(*(self._continue(http, e, prompt) for e in entries))
            tally = Counter(t for t in texts if t)
            if not tally:
                continue
            reference, votes = tally.most_common(1)[0]
            if votes * 2 <= len(entries):
                log.warning("canary %s of %s: no majority among %d workers (%s)", name, model,
                            len(entries), dict(tally))  # fmt: skip
                continue
            draft = Canary(name, prompt, reference)
            agreeing = [e for e, t in zip(entries, texts, strict=True) if t == reference]
            scores = await self._scores(http, draft, agreeing)
            if len(scores) * 2 <= len(entries):
                continue
            expected = round(statistics.median(scores.values()), 4)
            made.append(Canary(name, prompt, reference, expected, source))
        if len(made) == len(GOLDEN):
            self.canaries[model] = made
            log.info("canaries of %s made from %d workers: %s", model, len(entries),
                     [asdict(c) for c in made])  # fmt: skip
            if self._save is not None:
                async with self._saving:  # two models' saves at once wrote one file twice
                    await asyncio.to_thread(self._save, dict(self.canaries))

    async def _continue(self, http: Http, entry: WorkerEntry, prompt: str) -> str | None:
        body = orjson.dumps({
            "rid": f"meridian-canary-make-{next(self._ids)}", "text": prompt,
            "sampling_params": {"max_new_tokens": REFERENCE_TOKENS, "temperature": 0},
        })  # fmt: skip
        try:
            with self._owning(entry.spec.id) as spent:
                answer = await _post(http, entry.spec.url, body)
                spent(answer)
            doc: Any = orjson.loads(answer)
            text = doc["text"]
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as error:
            log.info("canary reference from %s: %s", entry.spec.id, error)
            return None
        return text if isinstance(text, str) else None


class Owned(Protocol):
    def owning(self, engine: str) -> AbstractContextManager[Callable[[int, int], None]]: ...


async def _post(http: Http, url: str, body: bytes) -> bytes:
    async with http.post(f"{url}/generate", data=body,
                         headers={"Content-Type": "application/json"}) as response:  # fmt: skip
        data = await response.read()
        if response.status != 200:
            raise ValueError(f"{url}/generate: {response.status} {data[:200]!r}")
        return data
