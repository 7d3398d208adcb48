"""Deterministic, cheap tokens for the simulator, counted as the shipped tokenizer counts them.

The shipped model directory (`model/`) holds a word-level `tokenizer.json` whose
pre-tokenizer splits text into runs of word characters and runs of punctuation. The
simulator splits the same way, so a client that loads that tokenizer counts the same
tokens. Words the vocabulary lacks get a stable hashed id instead of `<unk>`, so that
different prompts stay different in the prefix cache.
"""

from __future__ import annotations

import json
import re
import zlib
from array import array
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

MODEL_DIR = Path(__file__).with_name("model")
VOCAB_SIZE = 128_256
_PIECES = re.compile(r"\w+|[^\w\s]+")
_SPECIAL = 6  # ids below this are special tokens; generated text uses the words after them
_WORDS = 200  # the words generated text draws on
_WINDOW = 8  # the context's tokens that choose the next one


@cache
def _vocab() -> dict[str, int]:
    document = json.loads((MODEL_DIR / "tokenizer.json").read_text())
    vocab: dict[str, int] = document["model"]["vocab"]
    return vocab


@cache
def _names() -> dict[int, str]:
    return {i: word for word, i in _vocab().items()}


def _id(piece: str) -> int:
    known = _vocab().get(piece)
    if known is not None:
        return known
    span = VOCAB_SIZE - len(_vocab())
    return len(_vocab()) + zlib.crc32(piece.encode()) % span


def encode(text: str) -> list[int]:
    return [_id(piece) for piece in _PIECES.findall(text)]


def decode(ids: Sequence[int], after: str = "") -> str:
    """The text of `ids` where it follows the text `after`: words apart, as a word-level
    tokenizer detokenizes them in context (a space before the first when `after` ends in
    one's middle)."""
    if not ids:
        return ""
    names = _names()
    text = " ".join(names.get(i, f"w{i}") for i in ids)
    return " " + text if after and not after[-1].isspace() else text


def chat_prompt(messages: Sequence[dict[str, Any]], continue_final: bool = False) -> str:
    """The shipped chat template, applied the way the tokenizer_config.json states it. With
    `continue_final` (SGLang's `continue_final_message`), a last assistant message is left
    open for the answer to go on from, and no new assistant turn is begun."""
    parts = ["<|begin_of_text|>"]
    last = len(messages) - 1
    for n, message in enumerate(messages):
        role = message.get("role", "user")
        parts.append(
            f"<|start_header_id|>{role}<|end_header_id|>\n\n{_content(message.get('content'))}"
        )
        if n == last and continue_final and role == "assistant":
            return "".join(parts)
        parts.append("<|eot_id|>")
    parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(parts)


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def output_ids(prompt: Sequence[int], count: int) -> list[int]:
    """The `count` tokens a request generates, each a function of the context before it (the
    last few tokens of the prompt and of what came so far), as a model's greedy decoding is:
    a request continued from its prompt and its first k tokens goes on with the same tokens
    as the whole request did."""
    context = array("I", (i & 0xFFFFFFFF for i in prompt[-_WINDOW:]))
    out: list[int] = []
    for _ in range(count):
        token = _SPECIAL + zlib.crc32(context[-_WINDOW:].tobytes()) % _WORDS
        out.append(token)
        context.append(token)
    return out
