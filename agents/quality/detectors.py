"""What one answer shows about the worker that gave it, from bytes the relay already holds.
No I/O; run once an answer has ended, on its final text, never per chunk.

Each detector says whether one answer is suspect; none says a worker is bad. That is
decided against the other workers of the same model (`agents/quality/peers.py`), since what
is normal differs by model and workload: a model may well end most answers on the length cap
of a workload that asks for long ones, or answer in a script the prompt does not use.

Each judges only answers whose request could have had a good one: what the client asked for
itself is never held against the worker (a tenant could otherwise make any worker look bad).

- `repetition`: the text is mostly one short pattern over and over (`!!!!`, a token or a
  few repeated): it compresses to under `REPEAT_RATIO` of its length (natural text of any
  language compresses to about a third or more; a long run of one pattern to a few percent);
- `length`: the answer ended on its length cap, where the client set none or one of
  `LENGTH_JUDGED_FROM` tokens or more (a smaller cap is the client's choice, and an answer it
  cut says nothing of the worker);
- `empty`: no text and no tool call, where the client let the answer have `EMPTY_JUDGED_FROM`
  tokens or more and set no stop sequence (`max_tokens` 0 or 1, or a stop the answer begins
  with, make an empty answer the right one);
- `foreign`: most of its characters lie in Unicode blocks the prompt does not use (128
  code points a block; ASCII answers to any prompt are never foreign, and the check is only
  made for answers that are not ASCII);
- `invalid`: an answer asked for as JSON (`response_format`) that does not parse, or a tool
  call that names a tool the request did not offer, whose arguments do not parse, or break
  the tool's parameters schema (checked by jsonschema-rs, compiled once per schema), or no
  call (or another's) where `tool_choice` forced one; an
  answer cut by its length cap is not judged (JSON cut short does not parse).
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import jsonschema_rs
import orjson

REPEAT_MIN_CHARS = 64  # shorter texts are not judged for repetition
REPEAT_RATIO = 0.12  # compressed / raw below this: one pattern over and over
FOREIGN_SHARE = 0.5  # of the non-space characters, outside the prompt's blocks
LENGTH_JUDGED_FROM = 256  # a client's cap below this: an answer it cut is not judged
EMPTY_JUDGED_FROM = 16  # a client's cap below this: an empty answer is not judged
EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Answer:
    """What the relay knows of one ended answer."""

    text: str
    finish_reason: str | None = None
    tool_calls: Sequence[tuple[str, str]] = ()  # (name, arguments) of each call
    json_wanted: bool = False  # response_format json_object or json_schema
    # the tools offered: name -> its parameters' JSON schema, or None
    tools_offered: Mapping[str, Any] = field(default_factory=lambda: EMPTY)
    cap: int | None = None  # the most tokens the client let the answer have, if it said
    stops: bool = False  # the client gave stop sequences
    forced: str | None = None  # the tool call tool_choice forced: "*" (any), or its name


def suspect(answer: Answer, prompt: str | Callable[[], str]) -> frozenset[str]:
    """The detectors this answer trips (none, mostly); `prompt` is read only for an answer
    that is not ASCII."""
    text = answer.text
    found = []
    if len(text) >= REPEAT_MIN_CHARS and _ratio(text) < REPEAT_RATIO:
        found.append("repetition")
    cap, cut = answer.cap, answer.finish_reason == "length"
    if cut and (cap is None or cap >= LENGTH_JUDGED_FROM):
        found.append("length")
    if (
        not text.strip()
        and not answer.tool_calls
        and (cap is None or cap >= EMPTY_JUDGED_FROM)
        and not answer.stops
    ):
        found.append("empty")
    if not text.isascii():
        asked = prompt if isinstance(prompt, str) else prompt()
        if _foreign_share(text, asked) > FOREIGN_SHARE:
            found.append("foreign")
    if not cut and _invalid(answer):
        found.append("invalid")
    return frozenset(found)


def _ratio(text: str) -> float:
    raw = text.encode()
    return len(zlib.compress(raw, 1)) / len(raw)


def _foreign_share(text: str, prompt: str) -> float:
    blocks = {0} if prompt.isascii() else {ord(c) >> 7 for c in prompt}
    chars = [c for c in text if not c.isspace()]
    if not chars:
        return 0.0
    foreign = sum(1 for c in chars if ord(c) >> 7 not in blocks)
    return foreign / len(chars)


def _invalid(answer: Answer) -> bool:
    return invalid_json(answer) or invalid_tools(answer)


def invalid_json(answer: Answer) -> bool:
    """Asked for as JSON (`response_format`), it does not parse."""
    return answer.json_wanted and not answer.tool_calls and not _parses(answer.text)


def invalid_tools(answer: Answer) -> bool:
    """A tool call names a tool not offered, or its arguments do not parse or break the
    tool's parameters schema; or the call tool_choice forced was not made."""
    if unmet_tool_choice(answer):
        return True
    for name, arguments in answer.tool_calls:
        if name not in answer.tools_offered or not _parses(arguments):
            return True
        check = _validator(answer.tools_offered[name])
        if check is not None and not check.is_valid(orjson.loads(arguments)):
            return True
    return False


def unmet_tool_choice(answer: Answer) -> bool:
    """tool_choice forced a call ("required", or a function named) that the answer did not
    make: it made none, or called another."""
    forced = answer.forced
    if forced is None:
        return False
    if not answer.tool_calls:
        return True
    return forced != "*" and any(name != forced for name, _ in answer.tool_calls)


def _parses(text: str) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


def _validator(schema: Any) -> Any:
    """The compiled check of a tool's parameters, kept per schema (a request's tools are
    mostly the same few); None when there is none, or it is no JSON schema (the client's
    fault, not the worker's)."""
    if not isinstance(schema, dict):
        return None
    return _compiled(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))


@functools.lru_cache(maxsize=256)
def _compiled(schema: bytes) -> Any:
    try:
        return jsonschema_rs.validator_for(orjson.loads(schema))
    except (jsonschema_rs.ValidationError, ValueError, TypeError):
        return None
