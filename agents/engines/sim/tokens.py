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
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

MODEL_DIR = Path(__file__).with_name("model")
VOCAB_SIZE = 128_256
_PIECES = re.compile(r"\w+|[^\w\s]+")
_SPECIAL = 6  # ids below this are special tokens; generated text uses the words after them


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


def decode(ids: Sequence[int]) -> str:
    names = _names()
    return " ".join(names.get(i, f"w{i}") for i in ids)


def chat_prompt(messages: Sequence[dict[str, Any]]) -> str:
    """The shipped chat template, applied the way the tokenizer_config.json states it."""
    parts = ["<|begin_of_text|>"]
    for message in messages:
        parts.append(
            f"<|start_header_id|>{message.get('role', 'user')}<|end_header_id|>\n\n"
            f"{_content(message.get('content'))}<|eot_id|>"
        )
    parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(parts)


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def output_ids(seed: int, count: int) -> list[int]:
    """The `count` tokens a request generates: the same for the same prompt, every time."""
    words = 200
    return [_SPECIAL + (seed + i) % words for i in range(count)]


def prompt_seed(ids: Sequence[int]) -> int:
    return zlib.crc32(b"".join(i.to_bytes(4, "little") for i in ids[-64:]))
