"""Carrying a started answer on to another worker when its own fails mid-stream.

SGLang continues a generation from the prompt and the answer so far:
- chat: the messages with the answer so far as a last assistant message, and
  `continue_final_message: true` (the chat template leaves that message open instead of
  beginning a new turn);
- completions: the prompt's text followed by the answer's;
- `/generate`: the prompt's token ids followed by the `output_ids` so far (exact), or its
  text followed by the answer's.

Token ids are the most faithful, since text is tokenized again: `/generate` streams them, so it
gets them. The OpenAI endpoints stream only text (their `return_token_ids` would change every
chunk the client sees), so chat and completions continue from text, which a tokenizer reads
back as the same tokens except, rarely, where two tokens merge at the seam.

The answer so far is what reached the client: its events, kept as they went (no parse per
chunk) and folded into text every FOLD_BYTES. A continuation's answer is made to read as the
same stream: its first, role-only chat chunk is dropped, its usage counts the tokens the first
worker made as completion tokens, and `/generate`'s cumulative text and ids are prefixed with
what came before. The tokens made so far are counted one per content event, as SGLang streams
them by default (`--stream-interval 1`); the continuation's `max_tokens` is what is left.
"""

from __future__ import annotations

from typing import Any

import orjson

from agents.gateway.relay import EVENT_END, USAGE, Usage
from agents.gateway.requests import Inference

FOLD_BYTES = 64 * 1024  # the raw events a stream keeps before folding them into text
COMPLETION_MAX_TOKENS = 16  # OpenAI's (and SGLang's) default for /v1/completions
GENERATE_MAX_NEW_TOKENS = 128  # SGLang's default for /generate
DATA = b"data: "


class Transcript:
    """What of the answer reached the client."""

    __slots__ = (
        "_events", "_size", "calls", "finish_reason", "finished", "head", "kind", "last",
        "matched_stop", "open", "parts", "reasoning", "sent", "tokens", "usage",
    )  # fmt: skip

    def __init__(self, inference: Inference) -> None:
        self.kind = "native" if inference.native else "chat" if inference.messages else "text"
        self._events: list[bytes] = []
        self._size = 0
        self.sent = 0  # bytes, all told
        self.parts: list[str] = []  # the answer's text, folded
        self.tokens = 0  # its tokens, one per content event
        self.open = True  # only text so far: tool calls or reasoning cannot be continued
        self.finished = False  # its last content event (with a finish_reason) went out
        self.last: dict[str, Any] | None = None  # /generate: the last event (cumulative)
        self.finish_reason: str | None = None
        self.calls: dict[int, list[str]] = {}  # a chat's tool calls: index -> [name, arguments]
        # what a whole answer is made of (agents/gateway/gather.py): the first event's id,
        # created and model, the reasoning's text, the stop matched, the last usage seen (a
        # stream asked for `continuous_usage_stats` carries it in every event: then `tokens`
        # is its exact count, not one per event)
        self.head: dict[str, Any] | None = None
        self.reasoning: list[str] = []
        self.matched_stop: Any = None
        self.usage: dict[str, Any] | None = None

    def add(self, data: bytes) -> None:
        """Whole events as they went to the client: on the hot path, an append."""
        self._events.append(data)
        self._size += len(data)
        self.sent += len(data)
        if self._size > FOLD_BYTES:
            self.fold()

    def made(self) -> int:
        """The tokens the client got (read now: for an answer whose usage never came)."""
        self.fold()
        if self.kind == "native":
            meta = self.last.get("meta_info") if isinstance(self.last, dict) else None
            count = meta.get("completion_tokens") if isinstance(meta, dict) else None
            return count if isinstance(count, int) else 0
        return self.tokens

    def fold(self) -> None:
        """The events kept so far, read (all at once) into the answer's text."""
        if not self._events:
            return
        raw = b"".join(self._events)
        self._events.clear()
        self._size = 0
        docs = [e[len(DATA) :] for e in raw.split(EVENT_END) if e.startswith(b"data: {")]
        if not docs:
            return
        parsed = orjson.loads(b"[" + b",".join(docs) + b"]")
        if self.kind == "native":
            last = next((d for d in reversed(parsed) if "error" not in d), None)
            if last is not None:
                self.last = last
                meta = last.get("meta_info") or {}
                self.finished = meta.get("finish_reason") is not None
            return
        counted = None
        for doc in parsed:
            if self.head is None:
                self.head = {k: doc.get(k) for k in ("id", "created", "model")}
            usage = doc.get("usage")
            if isinstance(usage, dict):
                self.usage = usage
                if type(usage.get("completion_tokens")) is int:
                    counted = usage["completion_tokens"]
            choices = doc.get("choices")
            if not choices or not isinstance(choices, list):
                continue
            choice = choices[0]
            if self.kind == "chat":
                delta = choice.get("delta") or {}
                calls = delta.get("tool_calls")
                reasoning = delta.get("reasoning_content")
                if calls or reasoning:
                    self.open = False
                if calls:
                    self._calls(calls)
                if reasoning:
                    self.reasoning.append(str(reasoning))
                text = delta.get("content")
            else:
                text = choice.get("text")
            if text:
                self.parts.append(text)
                self.tokens += 1
            if choice.get("finish_reason") is not None:
                self.finished = True
                self.finish_reason = str(choice["finish_reason"])
                self.matched_stop = choice.get("matched_stop")
        if counted is not None:
            self.tokens = counted

    def _calls(self, calls: Any) -> None:
        """A chat stream's tool calls, pieced together: the name comes once, the arguments in
        parts."""
        for call in calls if isinstance(calls, list) else []:
            if not isinstance(call, dict):
                continue
            held = self.calls.setdefault(int(call.get("index") or 0), ["", ""])
            function = call.get("function") or {}
            held[0] += function.get("name") or ""
            held[1] += function.get("arguments") or ""

    def text(self) -> str:
        self.fold()
        return "".join(self.parts)


class Continuation:
    """The request that carries an answer on from `transcript`, and the rewriting that makes its
    stream read as the rest of the same one."""

    __slots__ = ("_first", "body", "prefix_ids", "prefix_text", "shift")

    def __init__(self, body: bytes, shift: int, prefix_text: str = "",
                 prefix_ids: list[int] | None = None) -> None:  # fmt: skip
        self.body = body  # the client's body with the answer so far, as the client's is sent
        self.shift = shift  # the answer's tokens before it
        self.prefix_text, self.prefix_ids = prefix_text, prefix_ids  # /generate's
        self._first = True

    def rewrite(self, data: bytes, native: bool) -> bytes:
        """Whole events of the continuation's stream, as the client is to see them."""
        if native:
            return b"".join(self._native(e) for e in data.split(EVENT_END)[:-1])
        if self._first or USAGE in data:
            kept = []
            for event in data.split(EVENT_END)[:-1]:
                if event.startswith(b"data: {"):
                    if self._first:
                        self._first = False
                        if _role_only(event):
                            continue
                    if USAGE in event:
                        event = self._usage_event(event)
                kept.append(event + EVENT_END)
            return b"".join(kept)
        return data

    def usage(self, usage: Usage) -> Usage:
        """The whole answer's: what the continuation read as prompt, the answer so far, is
        counted as completion."""
        prompt, completion = usage.prompt_tokens, usage.completion_tokens
        return Usage(
            None if prompt is None else max(0, prompt - self.shift),
            None if completion is None else completion + self.shift,
            usage.cached_tokens,
        )

    def _usage_event(self, event: bytes) -> bytes:
        doc = orjson.loads(event[len(DATA) :])
        usage = doc.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            usage["completion_tokens"] += self.shift
            if isinstance(usage.get("prompt_tokens"), int):
                usage["prompt_tokens"] = max(0, usage["prompt_tokens"] - self.shift)
        return DATA + orjson.dumps(doc)

    def _native(self, event: bytes) -> bytes:
        if not event.startswith(b"data: {"):
            return event + EVENT_END
        doc = orjson.loads(event[len(DATA) :])
        if "error" not in doc:
            doc["text"] = self.prefix_text + str(doc.get("text", ""))
            if self.prefix_ids is not None and isinstance(doc.get("output_ids"), list):
                doc["output_ids"] = self.prefix_ids + doc["output_ids"]
            meta = doc.get("meta_info")
            if isinstance(meta, dict) and isinstance(meta.get("completion_tokens"), int):
                meta["completion_tokens"] += self.shift
                if isinstance(meta.get("prompt_tokens"), int):
                    meta["prompt_tokens"] = max(0, meta["prompt_tokens"] - self.shift)
        return DATA + orjson.dumps(doc) + EVENT_END


def continuation(inference: Inference, body: bytes, transcript: Transcript) -> Continuation | None:
    """How to carry the answer on, or None when it cannot be (tool calls or reasoning streamed,
    a batch, an echo, or nothing left to generate)."""
    transcript.fold()
    if not transcript.open or transcript.finished:
        return None
    doc = orjson.loads(body)
    doc.pop("cache_salt", None)  # its tenant's is put in front (requests.Inference.salt)
    if inference.native:
        return _generate(doc, transcript)
    text, shift = transcript.text(), transcript.tokens
    if transcript.kind == "chat":
        messages: list[Any] = doc["messages"]
        last: dict[str, Any] = messages[-1] if isinstance(messages[-1], dict) else {}
        open_own = last.get("role") == "assistant" and isinstance(last.get("content"), str)
        if doc.get("continue_final_message") and open_own:
            last["content"] += text  # the client's own open message, carried on
        else:
            messages.append({"role": "assistant", "content": text})
        doc["continue_final_message"] = True
        if not _spend(doc, ("max_completion_tokens", "max_tokens"), shift, None):
            return None
    else:
        if doc.get("echo"):
            return None
        prompt = doc.get("prompt")
        if isinstance(prompt, str):
            doc["prompt"] = prompt + text
        elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            doc["prompt"] = [prompt[0] + text]
        else:
            return None
        if not _spend(doc, ("max_tokens",), shift, COMPLETION_MAX_TOKENS):
            return None
    return Continuation(orjson.dumps(doc), shift)


def _generate(doc: dict[str, Any], transcript: Transcript) -> Continuation | None:
    last = transcript.last
    if last is None:
        return None
    text = str(last.get("text", ""))
    ids = last.get("output_ids")
    ids = ids if isinstance(ids, list) else None
    prompt_ids, prompt_text = doc.get("input_ids"), doc.get("text")
    if isinstance(prompt_ids, list) and ids is not None and all(type(i) is int for i in prompt_ids):
        doc["input_ids"] = prompt_ids + ids
    elif isinstance(prompt_text, str):
        doc["text"] = prompt_text + text
    else:
        return None
    shift = len(ids) if ids is not None else transcript.tokens
    params = doc.get("sampling_params")
    params = params if isinstance(params, dict) else {}
    if not _spend(params, ("max_new_tokens",), shift, GENERATE_MAX_NEW_TOKENS):
        return None
    doc["sampling_params"] = params
    return Continuation(orjson.dumps(doc), shift, text, ids)


def _spend(doc: dict[str, Any], keys: tuple[str, ...], spent: int, default: int | None) -> bool:
    """The answer's cap lowered by what was made already; False when nothing is left."""
    for key in keys:
        value = doc.get(key)
        if type(value) is int:
            doc[key] = value - spent
            return value - spent > 0
    if default is not None:
        doc[keys[0]] = default - spent
        return default - spent > 0
    return True


def _role_only(event: bytes) -> bool:
    """SGLang's first chat chunk: the role, with no content yet."""
    choices = orjson.loads(event[len(DATA) :]).get("choices")
    if not choices:
        return False
    delta = choices[0].get("delta") or {}
    return not delta.get("content") and not delta.get("tool_calls") and "role" in delta
