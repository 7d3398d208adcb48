"""An ended answer as the detectors read it: from a whole body (one parse, after the client
has it) or from a stream's transcript (folded once, at its end)."""

from __future__ import annotations

from typing import Any

import orjson

from agents.gateway.migration import Transcript
from agents.gateway.requests import Inference
from agents.quality.detectors import Answer


def from_body(data: bytes, inference: Inference) -> Answer | None:
    try:
        doc: Any = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    if inference.native:
        meta = doc.get("meta_info") or {}
        finish = meta.get("finish_reason") or {}
        reason = finish.get("type") if isinstance(finish, dict) else None
        return Answer(str(doc.get("text") or ""), reason, cap=inference.max_new,
                      stops=inference.stops)  # fmt: skip
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    reason = choice.get("finish_reason")
    if inference.messages is None:
        return _answer(str(choice.get("text") or ""), reason, [], inference)
    message = choice.get("message") or {}
    calls = [(str(c.get("function", {}).get("name") or ""),
              str(c.get("function", {}).get("arguments") or ""))
             for c in message.get("tool_calls") or [] if isinstance(c, dict)]  # fmt: skip
    return _answer(str(message.get("content") or ""), reason, calls, inference)


def from_transcript(transcript: Transcript, inference: Inference) -> Answer:
    text = transcript.text()
    if inference.native:
        meta = (transcript.last or {}).get("meta_info") or {}
        finish = meta.get("finish_reason") or {}
        reason = finish.get("type") if isinstance(finish, dict) else None
        return Answer(str((transcript.last or {}).get("text") or ""), reason,
                      cap=inference.max_new, stops=inference.stops)  # fmt: skip
    calls = [(name, arguments) for name, arguments in transcript.calls.values()]
    return _answer(text, transcript.finish_reason, calls, inference)


def _answer(
    text: str, reason: str | None, calls: list[tuple[str, str]], inference: Inference
) -> Answer:
    return Answer(text, reason, calls, inference.json_wanted, inference.tools,
                  inference.max_new, inference.stops, inference.tool_forced)  # fmt: skip


def prompt_text(inference: Inference) -> str:
    """The prompt's text (a chat's messages' contents), for the foreign-script detector."""
    if inference.messages is None:
        return inference.text or ""
    parts = []
    for message in inference.messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "\n".join(parts)
