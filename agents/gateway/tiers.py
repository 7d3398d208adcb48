"""Tiered routes: a request for a virtual model is answered by one of its tiers, real models
from the cheapest to the strongest. The tier is chosen, in this order:

1. **Who asks.** A tenant that did not opt in (`tiering`) gets the strongest tier; one that
   did never goes below its floor (`tier_floor`). The operator's requests are tiered.
2. **Difficulty.** The route's table scores the request (agents/router/tiers.py), or an
   external classifier does within its time budget; past it, the table's score stands.
3. **The conversation.** A chat keeps the tier its conversation reached (keyed by its API
   key and its messages before the last exchange), so that tiering does not throw its
   cache away; a harder turn still moves it up. Another key's identical conversation is
   another conversation: nothing one caller sees depends on another's traffic.
4. **Capacity** (agents/gateway/service.py `choose`). When the tier's pool would break its
   SLO, the request moves to the next tier down (for tenants that opted in, above their
   floor), else up. A tenant that did not opt in is never moved down.
5. **Cascade** (`signal`). A non-streamed answer of a cheaper tier that shows a failure
   signal is asked again of the strongest tier, once; the client sees one answer.

Every answer says which tier answered and why (`x-meridian-tier`); metrics count each
choice, move and cascade by reason. The request's body is re-encoded once, with the tier's
model name, when its tier is chosen: the engines answer in the model's name.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from agents.books import Books
from agents.config import Cascade, ModelConfig, Tenant, TieredRouteConfig
from agents.gateway import answers
from agents.gateway.requests import Inference
from agents.quality.detectors import invalid_json, invalid_tools
from agents.router import tiers as classifier

log = logging.getLogger(__name__)
MAX_CONVERSATIONS = 100_000  # remembered tiers, least recently used dropped first
TIER_HEADER = "x-meridian-tier"


@dataclass(eq=False, slots=True)
class TierChoice:
    """Where a tiered request stands: its route, the tier answering, and why."""

    route: TieredRouteConfig
    index: int  # the tier answering now (0: the cheapest)
    floor: int  # the lowest tier it may go to (the strongest for a tenant not opted in)
    why: str  # difficulty | external | conversation | floor | not opted in | capacity | cascade
    detail: str = ""
    score: float | None = None
    moves: list[str] = field(default_factory=list)  # "a → b (why)"
    remember: bytes | None = None  # the conversation's key once this turn is answered
    doc: dict[str, Any] | None = None  # the body, parsed, to re-encode for another tier
    cascaded: str | None = None  # the signal that had the strongest tier answer
    streamed: bool = False  # the client asked for a stream
    buffers: bool = False  # a cheaper tier's stream is asked whole, judged, then streamed
    wants_usage: bool = False  # the client asked for the stream's usage chunk
    able: tuple[int, ...] = ()  # the tiers whose models take what it needs (tools, images)

    @property
    def model(self) -> str:
        return self.route.tiers[self.index]

    @property
    def top(self) -> int:
        """The strongest tier it may go to."""
        return max(self.able) if self.able else len(self.route.tiers) - 1

    def header(self) -> str:
        """What every client sees of it: the tier that answered, and why."""
        why = self.why + (f" ({self.detail})" if self.detail else "")
        return f"{self.model}; tier={self.index + 1}/{len(self.route.tiers)}; why={why}"

    def describe(self) -> dict[str, object]:
        """The route receipt's part (x-meridian-route)."""
        return {
            "route": self.route.name, "tier": self.index, "model": self.model, "why": self.why,
            "detail": self.detail, "score": self.score, "moves": self.moves,
            **({"cascaded": self.cascaded} if self.cascaded else {}),
        }  # fmt: skip

    def order(self) -> list[int]:
        """The tiers to try under load, the chosen first: down to the floor, then up."""
        down = range(self.index - 1, self.floor - 1, -1)
        tiers = [self.index, *down, *range(self.index + 1, self.top + 1)]
        return [i for i in tiers if not self.able or i in self.able]


class Tiers:
    """The gateway's tiered routes: conversations' tiers, the external classifiers' client,
    and what was chosen, moved and cascaded, counted."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, books: Books | None = None
    ) -> None:
        self.clock = clock
        self.books = books if books is not None else Books()  # what each tier answered, moved
        self._conversations: OrderedDict[bytes, tuple[str, float]] = OrderedDict()
        self._session: aiohttp.ClientSession | None = None

    def status(self) -> list[dict[str, Any]]:
        """Per tiered route: the requests each tier answered and why, the moves under load,
        the cascades (agent status, and the heartbeat's)."""
        books = self.books
        routes = {k[0] for k in books.tier_answered} | {k[0] for k in books.tier_moves}
        routes |= {k[0] for k in books.cascades}
        return [self._route_status(route) for route in sorted(routes)]

    def _route_status(self, route: str) -> dict[str, Any]:
        books = self.books
        answered = sorted((k, n) for k, n in books.tier_answered.items() if k[0] == route)
        moves = sorted((k, n) for k, n in books.tier_moves.items() if k[0] == route)
        return {
            "route": route,
            "answered": [{"model": m, "why": w, "count": n} for (_, m, w), n in answered],
            "moves": [{"from": a, "to": b, "why": w, "count": n} for (_, a, b, w), n in moves],
            "cascades": {s: n for (r, s), n in sorted(books.cascades.items()) if r == route},
            "external_late": books.external_late.get(route, 0),
        }

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def choose(
        self,
        route: TieredRouteConfig,
        tenant: Tenant,
        operator: bool,
        inference: Inference,
        prompt_tokens: int,
        models: Mapping[str, ModelConfig],
        scope: str,
    ) -> TierChoice:
        """The tier a request starts on (capacity may move it later); `scope`: whose
        conversations it may continue (its API key's)."""
        doc = inference.doc
        able = tuple(i for i, m in enumerate(route.tiers) if _able(models[m], inference))
        able = able or (len(route.tiers) - 1,)
        top = max(able)
        if not (tenant.tiering or operator):
            return TierChoice(route, top, top, "not opted in", doc=doc, able=able)
        floor = min(able)
        if tenant.tier_floor in route.tiers:
            floor = max(floor, route.tiers.index(tenant.tier_floor))
        effort = None
        if doc is not None:
            effort = doc.get("reasoning_effort")
            kwargs = doc.get("chat_template_kwargs")
            if effort is None and isinstance(kwargs, dict) and kwargs.get("enable_thinking"):
                effort = True
        features = classifier.features(
            inference.messages, inference.text, prompt_tokens, inference.max_new,
            bool(inference.tools), inference.json_wanted, effort,
        )  # fmt: skip
        index, score = route.table.tier(features)
        why, detail = "difficulty", f"score {score:.2f}"
        if route.external_url is not None:
            external = await self._external(route, features, inference)
            if external is not None:
                index, score = external
                why = "external"
                detail = f"score {score:.2f}" if score == score else ""  # NaN: it named a tier
        choice = TierChoice(route, index, floor, why, detail, score, doc=doc, able=able)
        choice.buffers = route.cascade is not None and route.cascade.buffer_streams
        choice.wants_usage = inference.wants_usage
        if inference.messages is not None and route.conversation_ttl_s > 0:
            before, choice.remember = _conversation(scope, inference.messages)
            held = self._held(before, route)
            if held is not None and held > choice.index:
                choice.index, choice.why, choice.detail = held, "conversation", ""
        if choice.index < floor:
            choice.index, choice.why, choice.detail = floor, "floor", ""
        if choice.index not in able:  # the next tier up that takes it, else the strongest
            choice.index = next((i for i in able if i > choice.index), top)
        return choice

    def settled(self, choice: TierChoice) -> None:
        """The request was answered on `choice`'s tier: counted, and its conversation keeps
        the tier."""
        route = choice.route
        self.books.tier_answered[route.name, choice.model, choice.why] += 1
        if choice.remember is not None:
            expires = self.clock() + route.conversation_ttl_s
            self._conversations[choice.remember] = (choice.model, expires)
            self._conversations.move_to_end(choice.remember)
            while len(self._conversations) > MAX_CONVERSATIONS:
                self._conversations.popitem(last=False)

    def moved(self, choice: TierChoice, to: int, why: str, detail: str) -> None:
        route = choice.route
        came = choice.model
        choice.index, choice.why, choice.detail = to, why, detail
        choice.moves.append(f"{came} → {choice.model} ({detail})")
        self.books.tier_moves[route.name, came, choice.model, why] += 1

    def _held(self, key: bytes | None, route: TieredRouteConfig) -> int | None:
        if key is None:
            return None
        found = self._conversations.get(key)
        if found is None:
            return None
        model, expires = found
        if expires < self.clock():
            del self._conversations[key]
            return None
        return route.tiers.index(model) if model in route.tiers else None

    async def _external(
        self, route: TieredRouteConfig, features: dict[str, float], inference: Inference
    ) -> tuple[int, float] | None:
        """The external classifier's tier, or None when it did not answer well within its
        budget (the table's score then stands)."""
        assert route.external_url is not None
        if self._session is None:
            self._session = aiohttp.ClientSession()
        text = classifier.last_turn(inference.messages, inference.text)
        body = orjson.dumps({"route": route.name, "tiers": route.tiers,
                             "features": features, "text": text})  # fmt: skip
        try:
            async with asyncio.timeout(route.external_budget_s):
                async with self._session.post(
                    route.external_url, data=body, headers={"Content-Type": "application/json"}
                ) as answer:
                    if answer.status != 200:
                        raise ValueError(f"answered {answer.status}")
                    doc = orjson.loads(await answer.read())
        except (TimeoutError, OSError, ValueError, aiohttp.ClientError) as error:
            self.books.external_late[route.name] += 1
            log.info("external classifier of %s: %s", route.name, error or "past its budget")
            return None
        return _external_answer(doc, route)

    def signal(self, cascade: Cascade, data: bytes, inference: Inference) -> str | None:
        """The first of the cascade's failure signals a whole answer shows, or None."""
        answer = answers.from_body(data, inference)
        if answer is None:
            return None
        signals = cascade.signals
        if "invalid_json" in signals and inference.json_wanted and invalid_json(answer):
            return "invalid_json"
        if "tool_schema" in signals and answer.tool_calls and invalid_tools(answer):
            return "tool_schema"
        if "length" in signals and answer.finish_reason == "length":
            return "length"
        if "low_logprob" in signals:
            mean = mean_logprob(data)
            if mean is not None and mean < cascade.min_mean_logprob:
                return "low_logprob"
        return None


def _able(model: ModelConfig, inference: Inference) -> bool:
    """Whether the tier's model takes what the request needs (tools, images)."""
    return inference.needs <= model.capabilities


def _conversation(scope: str, messages: list[Any]) -> tuple[bytes | None, bytes]:
    """The key of the conversation this chat continues (its messages before the last
    exchange: what the previous turn sent), and this turn's key (all its messages), both
    within `scope` (the caller's API key): no caller continues, or learns of, another's."""
    digest = hashlib.blake2b(scope.encode() + b"\0", digest_size=16)
    before = None
    for i, message in enumerate(messages):
        if i == len(messages) - 2 and i > 0:
            before = digest.copy().digest()
        if isinstance(message, dict):
            digest.update(orjson.dumps([message.get("role"), message.get("content")]))
    return before, digest.digest()


def _external_answer(doc: Any, route: TieredRouteConfig) -> tuple[int, float] | None:
    if not isinstance(doc, dict):
        return None
    tier = doc.get("tier")
    if isinstance(tier, int) and not isinstance(tier, bool) and 0 <= tier < len(route.tiers):
        return tier, float("nan")
    score = doc.get("score")
    if isinstance(score, int | float) and not isinstance(score, bool):
        return route.table.tier_of(float(score)), float(score)
    return None


def mean_logprob(data: bytes) -> float | None:
    """The mean token log-probability of a whole chat or completion answer, when it has them."""
    try:
        doc = orjson.loads(data)
        logprobs = doc["choices"][0]["logprobs"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return None
    if not isinstance(logprobs, dict):
        return None
    values: Any = logprobs.get("token_logprobs")
    if values is None and isinstance(logprobs.get("content"), list):
        values = [t.get("logprob") for t in logprobs["content"] if isinstance(t, dict)]
    numbers = [v for v in values or () if isinstance(v, int | float)]
    return sum(numbers) / len(numbers) if numbers else None


def as_stream(response: web.StreamResponse, inference: Inference, usage: bool) -> web.Response:
    """A whole answer, judged, as the stream the client asked for: a chunk with the role, one
    with the whole content (or tool calls) and the finish reason, the usage if asked, [DONE]."""
    assert isinstance(response, web.Response)
    assert isinstance(response.body, bytes)
    doc = orjson.loads(response.body)
    head = {k: doc.get(k) for k in ("id", "created", "model")}
    choice = (doc.get("choices") or [{}])[0]
    events = []
    if inference.messages is not None:
        head["object"] = "chat.completion.chunk"
        message = choice.get("message") or {}
        delta: dict[str, Any] = {"content": message.get("content")}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
        events.append(head | {"choices": [{"index": 0, "delta": {"role": "assistant",
                                                                  "content": ""},
                                           "finish_reason": None}]})  # fmt: skip
        events.append(
            head
            | {
                "choices": [
                    {
                        "index": 0,
                        "delta": delta,
                        "logprobs": None,
                        "finish_reason": choice.get("finish_reason"),
                    }
                ]
            }
        )
    else:
        head["object"] = "text_completion"
        events.append(
            head
            | {
                "choices": [
                    {
                        "index": 0,
                        "text": choice.get("text", ""),
                        "logprobs": None,
                        "finish_reason": choice.get("finish_reason"),
                    }
                ]
            }
        )
    if usage and doc.get("usage") is not None:
        events.append(head | {"choices": [], "usage": doc["usage"]})
    body = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    headers = {k: v for k, v in response.headers.items()
               if k.lower() not in ("content-type", "content-length")}  # fmt: skip
    return web.Response(body=body, status=200, headers=headers, content_type="text/event-stream")


def without_logprobs(data: bytes) -> bytes:
    """A whole answer without the log-probabilities the gateway asked for, not the client."""
    doc = orjson.loads(data)
    for choice in doc.get("choices") or ():
        if isinstance(choice, dict):
            choice["logprobs"] = None
    return orjson.dumps(doc)
